"""fused_optimizer (L2): torch.optim Adam / AdamW / SGD as one fused multi-tensor kernel.

cpu and cuda: `fused=True`. On CPU this is the vectorised `_fused_adamw_` kernel (torch >=
2.4); `foreach=True` is no help there: measured on this project's CPU (AdamW, 32 tensors,
single thread) default 10.9 ms, foreach 10.6 ms, fused 1.5 ms p10 (2 small tensors: 0.26 /
0.25 / 0.10 ms); fused and default agree to 1e-8 after 3 steps. Constructions that already
choose `fused=` / `foreach=`, or use `capturable=` / `differentiable=`, are left alone. A
construction that passes a `**dict` (the single-file trainers' `**extra_args`, which holds
`fused=` chosen by device) may already choose: adding `fused=True` next to it raises
"got multiple values for keyword argument 'fused'" when it does. There the dict itself is
overridden, `**{**extra_args, "fused": True, "foreach": None}` (foreach=None is the default
and cannot clash with fused).

npu: `torch_npu.optim.NpuFused{Adam,AdamW,SGD}` with the same arguments (only the ones
those classes take). Caveat from the torch_npu docs: they pack the parameters and their
gradients into contiguous buffers, so `zero_grad(set_to_none=True)` raises, and a gradient
set to None (which `model.zero_grad()` / `model.zero_grad(set_to_none=True)` also do, the
default since torch 2.0) is reallocated outside the packed buffer. The recipe therefore
rewrites every `zero_grad(...)` call of the program to `zero_grad(set_to_none=False)` (on the
optimizer and on modules alike). Side effect: parameters that get no gradient in a step
see a zero gradient instead of None; optimizers that skip `p.grad is None` (Muon, say) then
update them with a zero gradient (momentum decays). Parameters must not be recreated after
the optimizer is built, and must already be on the npu.
"""

from __future__ import annotations

import libcst as cst

from ...pysource.edits import Edits
from ...pysource.imports import ensure_imports, module_aliases
from ...pysource.shapes import dotted, kwarg
from ...pysource.sites import positions
from ...pysource.syntax import code, expr, walk
from .recipe_base import NotApplicable, Recipe, Site, shorten

_FUSABLE = {"Adam", "AdamW", "SGD"}
_NPU_ARGS = {
    "Adam": {"lr", "betas", "eps", "weight_decay", "amsgrad"},
    "AdamW": {"lr", "betas", "eps", "weight_decay", "amsgrad"},
    "SGD": {"lr", "momentum", "dampening", "weight_decay", "nesterov"},
}


def _optimizer_class(node: cst.Call, aliases: dict[str, str]) -> str | None:
    d = dotted(node.func)
    if d is None:
        return None
    head = d.split(".")[0]
    full = (aliases.get(head, head) + d[len(head):]) if head in aliases else d
    parts = full.split(".")
    if len(parts) >= 3 and parts[0] == "torch" and parts[1] == "optim" and parts[-1] in _FUSABLE:
        return parts[-1]
    return None


class FusedOptimizerRecipe(Recipe):
    def _sites(self, rel, text, target):
        pos = positions(text)
        aliases = module_aliases(pos.module)
        quals = pos.qualnames()
        out = []
        for node in walk(pos.module):
            if not isinstance(node, cst.Call):
                continue
            cls = _optimizer_class(node, aliases)
            if cls is None:
                continue
            if any(kwarg(node, k) is not None for k in ("fused", "foreach", "capturable", "differentiable")):
                continue
            if target == "npu":
                extra = {a.keyword.value for a in node.args if a.keyword is not None} - _NPU_ARGS[cls]
                if extra or len([a for a in node.args if a.keyword is None and not a.star]) > 1 \
                        or any(a.star for a in node.args):  # unknown keywords NpuFused* may not take
                    continue
            out.append((Site(file=rel, qualname=quals.get(pos.line(node), "<module>"), line=pos.line(node),
                             end_line=pos.end_line(node), text=shorten(code(node)), detail={"optimizer": cls}), node, cls))
        return pos, out

    def _find_file(self, rel, text, target):
        return [s for s, _, _ in self._sites(rel, text, target)[1]]

    def apply(self, files, target, sites=None, *, protected=None):
        out = super().apply(files, target, sites, protected=protected)
        if target != "npu" or isinstance(out, NotApplicable):
            return out
        # every zero_grad of the program keeps the gradient buffers (see the module docstring)
        new, changed, notes = dict(out.files), list(out.changed_files), list(out.notes)
        for rel in sorted(new):
            if not rel.endswith(".py") or "zero_grad" not in new[rel]:
                continue
            pos = positions(new[rel])
            edits = Edits()
            for node in walk(pos.module):
                if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "zero_grad":
                    if code(node).endswith("zero_grad(set_to_none=False)"):
                        continue
                    edits.sub(node, expr(f"{code(node.func)}(set_to_none=False)"))
                    notes.append(f"{rel}:{pos.line(node)}: {shorten(code(node), 80)} -> set_to_none=False "
                                 "(NpuFused optimizers keep gradients in packed buffers)")
            if edits:
                new[rel] = edits.apply(pos.module).code
                if rel not in changed:
                    changed.append(rel)
        return out.model_copy(update={"files": new, "changed_files": changed, "notes": notes})

    def _rewrite_file(self, rel, text, target, sites):
        pos, found = self._sites(rel, text, target)
        want = {(s.qualname, s.line) for s in sites}
        edits, done = Edits(), []
        npu = False
        for site, node, cls in found:
            if (site.qualname, site.line) not in want:
                continue
            if target == "npu":
                edits.sub(node, node.with_changes(func=expr(f"torch_npu.optim.NpuFused{cls}")))
                npu = True
            elif any(a.star == "**" for a in node.args):
                args = [a.with_changes(value=expr(f'{{**{code(a.value)}, "fused": True, "foreach": None}}'))
                        if a.star == "**" else a for a in node.args]
                edits.sub(node, node.with_changes(args=args))
            else:
                args = list(node.args)
                last = args[-1]
                if isinstance(last.comma, cst.Comma):
                    newarg = cst.Arg(keyword=cst.Name("fused"), value=cst.Name("True"),
                                     equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                           whitespace_after=cst.SimpleWhitespace("")),
                                     comma=last.comma)
                    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                    args.append(newarg)
                else:
                    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                    args.append(cst.Arg(keyword=cst.Name("fused"), value=cst.Name("True"),
                                        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                              whitespace_after=cst.SimpleWhitespace(""))))
                edits.sub(node, node.with_changes(args=args))
            done.append(site)
        module = edits.apply(pos.module)
        notes = []
        if npu:
            module = ensure_imports(module, ["import torch_npu"])
            notes.append("NpuFused optimizers: params must be on the npu before construction and must not be "
                         "recreated; zero_grad(set_to_none=True) raises (every zero_grad is rewritten)")
        else:
            notes.append("fused=True needs floating-point parameters on one device type (cpu: torch >= 2.4)")
        return module.code, done, notes

    def _no_site_reason(self, files, target):
        return ("fused_optimizer: no torch.optim Adam/AdamW/SGD construction without fused=/foreach= "
                + ("(npu: or with arguments NpuFused optimizers do not take)" if target == "npu" else "") + " found")
