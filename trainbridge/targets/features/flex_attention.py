"""Port FlexAttention (`torch.nn.attention.flex_attention`) to the `_tb_flex_attention` shim.

Why: the GPU program's FlexAttention runs a Triton kernel that visits only the blocks its
`BlockMask` lists; on the CPU, torch's eager fallback ignores those lists (the records'
sliding windows live only there), and the NPU has no Triton. The shim computes the same
attention with SDPA / `npu_fusion_attention` and the BlockMask's token mask.

Edits, each one `PortChange`:

* the import (`from torch.nn.attention.flex_attention import ...`, `import ... as fa`,
  `from torch.nn.attention import flex_attention as fa`, or the dotted
  `torch.nn.attention.flex_attention.X` uses) now names the shim (kind attention_replaced);
  the program's names (`flex_attention`, `create_block_mask`, `BlockMask`) stay as written;
* `create_block_mask(..., _compile=True)` loses `_compile` (compile_removed);
* `torch.compile(flex_attention, ...)` / `torch.compile(create_block_mask, ...)` become the
  name itself (compile_removed): compiling the shim is not what the GPU program compiled;
* the shim file is added (shim_added), set to the target's operator.

Blockers: a `score_mod` argument, `return_aux` asking for max_scores, an imported name the shim lacks, an
import form that cannot be rewritten in place.
"""

from __future__ import annotations

import libcst as cst

from ...pysource.imports import ensure_imports
from ...pysource.shapes import dotted
from ...pysource.syntax import code
from ..port_models import PortTarget
from ..registry import target_spec
from ..shims import flex_attention as _shim
from . import FeatureResult
from ._attention_port import (
    Recorder,
    literal_value,
    run,
    shim_module,
    unparseable,
    with_shim,
    without_kwarg,
)

SHIM = "flex_attention"
FLEX_MODULE = "torch.nn.attention.flex_attention"
SHIM_API = frozenset(_shim.__all__)
_NOTE = ("FlexAttention's Triton kernel -> SDPA / npu_fusion_attention with the BlockMask's token mask "
         "(full blocks visible, partial blocks through mask_mod, unlisted blocks masked), as on the GPU")


class _Bindings(cst.CSTVisitor):
    """Names the program binds to FlexAttention's functions and module, wherever it imports them."""

    def __init__(self):
        super().__init__()
        self.functions: dict[str, str] = {}   # local name -> flex API name
        self.modules: set[str] = set()        # local names bound to the flex module
        self.dotted = False                   # `import torch.nn.attention.flex_attention` (no alias)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        mod = code(node.module) if node.module else ""
        if isinstance(node.names, cst.ImportStar):
            if mod == FLEX_MODULE:
                self.functions.update({n: n for n in SHIM_API})
            return
        for a in node.names:
            name, local = code(a.name), code(a.asname.name) if a.asname else code(a.name)
            if mod == FLEX_MODULE:
                self.functions[local] = name
            elif mod == "torch.nn.attention" and name == "flex_attention":
                self.modules.add(local)

    def visit_Import(self, node: cst.Import) -> None:
        for a in node.names:
            if code(a.name) == FLEX_MODULE:
                if a.asname:
                    self.modules.add(code(a.asname.name))
                else:
                    self.dotted = True


class _Porter(Recorder):
    def __init__(self, file: str, bindings: _Bindings):
        super().__init__(file)
        self.b = bindings
        self.shim = shim_module(SHIM)
        self.calls: list[int] = []
        self.need_import = False

    # ------------------------------------------------------------------ imports ----
    def visit_Import(self, node) -> bool:
        return False

    def visit_ImportFrom(self, node) -> bool:
        return False

    def leave_Import(self, original: cst.Import, updated: cst.Import):
        names = []
        for a in updated.names:
            if code(a.name) == FLEX_MODULE and a.asname:
                names.append(a.with_changes(name=cst.Name(self.shim)))
            else:
                names.append(a)
        new = updated.with_changes(names=names)
        if code(new) != code(original):
            self.change(original, "attention_replaced", code(original), code(new), _NOTE)
        return new

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom):
        mod = code(original.module) if original.module else ""
        if mod == FLEX_MODULE:
            if not isinstance(original.names, cst.ImportStar):
                missing = [code(a.name) for a in original.names if code(a.name) not in SHIM_API]
                if missing:
                    self.block(original, f"from {FLEX_MODULE} import {', '.join(missing)}",
                               f"the shim provides {', '.join(sorted(SHIM_API))} only")
                    return updated
            new = updated.with_changes(module=cst.Name(self.shim), relative=[])
            self.change(original, "attention_replaced", code(original), code(new), _NOTE)
            return new
        if mod == "torch.nn.attention" and not isinstance(original.names, cst.ImportStar) and any(
                code(a.name) == "flex_attention" for a in original.names):
            if len(original.names) != 1:
                self.block(original, code(original), "imports the flex_attention module together with other names; "
                                                     "split the import so the module alone can name the shim")
                return updated
            alias = original.names[0]
            local = code(alias.asname.name) if alias.asname else "flex_attention"
            new = cst.Import(names=[cst.ImportAlias(name=cst.Name(self.shim),
                                                    asname=cst.AsName(name=cst.Name(local)))])
            self.change(original, "attention_replaced", code(original), code(new), _NOTE)
            return new
        return updated

    # ---------------------------------------------------------------- attributes ----
    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        if self.b.dotted and dotted(original) == FLEX_MODULE:
            self.need_import = True
            self.change(original, "attention_replaced", FLEX_MODULE, self.shim, _NOTE)
            return cst.Name(self.shim)
        if isinstance(original.value, cst.Name) and original.value.value in self.b.modules \
                and original.attr.value not in SHIM_API:
            self.block(original, code(original), f"the shim provides {', '.join(sorted(SHIM_API))} only")
        return updated

    # --------------------------------------------------------------------- calls ----
    def _api(self, func) -> str | None:
        """Which flex function a call's target names, if any."""
        if isinstance(func, cst.Name):
            return self.b.functions.get(func.value)
        if isinstance(func, cst.Attribute):
            head = dotted(func.value)
            if head in self.b.modules or (self.b.dotted and head == FLEX_MODULE):
                return func.attr.value
        return None

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if dotted(original.func) == "torch.compile" and original.args and original.args[0].keyword is None \
                and self._api(original.args[0].value) in ("flex_attention", "create_block_mask"):
            inner = updated.args[0].value
            self.change(original, "compile_removed", code(original), code(inner),
                        "the shim runs eager: compiling it is not the GPU program's Triton kernel")
            return inner
        api = self._api(original.func)
        if api == "flex_attention":
            self.calls.append(self.line(original))
            self._check_flex_call(original)
        elif api == "create_block_mask" and any(a.keyword is not None and a.keyword.value == "_compile"
                                                for a in original.args):
            new = without_kwarg(updated, "_compile")
            self.change(original, "compile_removed", code(original), code(new),
                        "the shim builds the block mask eagerly (no torch.compile)")
            return new
        return updated

    def _check_flex_call(self, call: cst.Call) -> None:
        positional = [a for a in call.args if a.keyword is None]
        if any(a.star for a in call.args):
            self.block(call, code(call), "arguments passed with * / **: cannot check for score_mod")
            return
        score_mod = positional[3].value if len(positional) > 3 else None
        for a in call.args:
            if a.keyword is not None and a.keyword.value == "score_mod":
                score_mod = a.value
        if score_mod is not None and literal_value(score_mod) is not None:
            self.block(call, f"flex_attention score_mod={code(score_mod)}",
                       "score_mod is not supported by the shim (it masks with the BlockMask only)")
        for a in call.args:
            if a.keyword is not None and a.keyword.value == "return_aux" and "max_scores" in code(a.value):
                self.block(call, f"flex_attention return_aux={code(a.value)}",
                           "return_aux max_scores is not supported by the shim (lse is)")


def _port_file(rel: str, text: str) -> tuple[str, _Porter | None, list]:
    if "flex_attention" not in text:
        return text, None, []
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as err:
        return text, None, [unparseable(rel, err)]
    bindings = _Bindings()
    module.visit(bindings)
    if not (bindings.functions or bindings.modules or bindings.dotted):
        return text, None, []
    porter = _Porter(rel, bindings)
    new = run(text, porter)
    if porter.need_import:
        new = ensure_imports(cst.parse_module(new), [f"import {porter.shim}"]).code
    first = next((c for c in porter.changes if c.kind == "attention_replaced"), None)
    if first is not None and porter.calls:  # the call sites now run the shim, unedited: say where they are
        first.note = f"{first.note} (flex_attention calls at lines {', '.join(map(str, porter.calls))})"
    return new, porter, porter.blockers


def port(files: dict[str, str], target: PortTarget) -> FeatureResult:
    """The program with FlexAttention replaced by the shim (module doc); cuda: unchanged."""
    if target_spec(target).source_device:
        return FeatureResult(files=dict(files))
    out, changes, blockers = dict(files), [], []
    replaced = False
    for rel, text in files.items():
        if not rel.endswith(".py") or rel == f"{shim_module(SHIM)}.py":
            continue
        new, porter, file_blockers = _port_file(rel, text)
        blockers.extend(file_blockers)
        if porter is None:
            continue
        out[rel] = new
        changes.extend(porter.changes)
        replaced |= any(c.kind == "attention_replaced" for c in porter.changes)
    if replaced:
        out, shim_change = with_shim(out, SHIM, target)
        changes.append(shim_change)
    return FeatureResult(files=out, changes=changes, blockers=blockers)

