"""Level-L0 precision recipe: the GPU program's explicit bf16 math, in fp32 where bf16 is slow.

Record-style programs cast to bf16 by hand where the GPU's tensor cores make it pay: the
Newton-Schulz iteration of Muon (`G.bfloat16()`), bf16 communication buffers, bf16
activations (`.bfloat16()` embeddings). Ported unchanged to a target without bf16 math
units (here: x86 CPUs without AVX512-BF16/AMX, see targets/capabilities.py), every such
matmul is emulated, 10-40x slower than fp32. This recipe rewrites one function's explicit
bf16 casts and bf16 tensor allocations to fp32: more precise than the GPU program, never
less, and one function per candidate so each is measured on its own.

`torch.autocast` regions are not touched (autocast_reapply owns them).
"""

from __future__ import annotations

import libcst as cst

from ...targets.capabilities import fast_bf16
from ...pysource.edits import Edits
from ...pysource.shapes import dotted, kwarg, positional
from ...pysource.sites import positions
from ...pysource.syntax import code, walk
from .recipe_base import Recipe, Site, shorten

_BF16 = ("torch.bfloat16",)


def _is_bf16(node) -> bool:
    return node is not None and dotted(node) in _BF16


def _bf16_nodes(call: cst.Call) -> list[tuple[cst.CSTNode, cst.CSTNode]]:
    """(node, replacement) pairs that make this call fp32 instead of bf16."""
    d = dotted(call.func) or ""
    if d.endswith("autocast"):
        return []
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "bfloat16" and not call.args:
        return [(call.func.attr, cst.Name("float"))]  # x.bfloat16() -> x.float()
    out = []
    dt = kwarg(call, "dtype")
    if _is_bf16(dt):
        out.append((dt, cst.parse_expression("torch.float32")))
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("to", "type"):
        for a in positional(call):
            if _is_bf16(a):
                out.append((a, cst.parse_expression("torch.float32")))
    return out


class Fp32WhereBf16IsSlowRecipe(Recipe):
    def _sites_with_nodes(self, rel, text):
        pos = positions(text)
        scope_of = pos.qualnames()
        by_fn: dict[str, list] = {}
        lines: dict[str, list[int]] = {}
        for node in walk(pos.module):
            if isinstance(node, cst.Call):
                pairs = _bf16_nodes(node)
                if pairs:
                    q = scope_of.get(pos.line(node), "<module>")
                    by_fn.setdefault(q, []).extend(pairs)
                    lines.setdefault(q, []).append(pos.line(node))
        sites = [Site(file=rel, qualname=q, line=min(lines[q]), end_line=max(lines[q]),
                      text=shorten("; ".join(code(n) for n, _ in by_fn[q][:4])),
                      detail={"casts": str(len(by_fn[q]))}) for q in by_fn]
        return pos, sites, by_fn

    def _find_file(self, rel, text, target):
        if fast_bf16(target):
            return []
        return self._sites_with_nodes(rel, text)[1]

    def _rewrite_file(self, rel, text, target, sites):
        pos, found, by_fn = self._sites_with_nodes(rel, text)
        want = {s.qualname for s in sites}
        edits, done = Edits(), []
        for site in found:
            if site.qualname not in want:
                continue
            for node, new in by_fn[site.qualname]:
                edits.sub(node, new)
            done.append(site)
        notes = [f"{s.file}:{s.line} {s.qualname}: {s.detail['casts']} bf16 cast(s)/allocation(s) now fp32"
                 for s in done]
        notes.append("the target has no bf16 math units (targets/capabilities.py): fp32 is faster there and more "
                     "precise than the GPU program, so the low-precision loss tolerance applies against the bf16 port")
        return edits.apply(pos.module).code, done, notes

    def _no_site_reason(self, files, target):
        if fast_bf16(target):
            return f"fp32_where_bf16_slow: {target} runs bf16 natively; the GPU program's bf16 stays"
        return "fp32_where_bf16_slow: no explicit bf16 cast or bf16 allocation outside autocast"
