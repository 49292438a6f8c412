"""Port FlashAttention-3 (`flash_attn_interface`, `kernels.get_kernel(<FA3 repo>)`) to the `_tb_flash_attention` shim.

Why: FA3 is a Hopper-only CUDA library, and the `kernels` package form downloads a binary
when the program starts; neither exists on a CPU or an Ascend NPU. The shim gives FA3's
`flash_attn_varlen_func` (per-document causal attention with FA3's window) on SDPA or
`npu_fusion_attention` (TND layout).

Edits, each one `PortChange` (kind attention_replaced unless said):

* `from flash_attn_interface import flash_attn_varlen_func` -> `from _tb_flash_attention import ...`;
  `import flash_attn_interface [as X]` -> `import _tb_flash_attention as X`;
* every `get_kernel('<an FA3 repository>', ...)` call (whatever it is assigned to, inside
  try/except too) -> `_tb_flash_attention`: the shim is its own `.flash_attn_interface`, so
  `get_kernel(...).flash_attn_interface` and `getattr(mod, "flash_attn_interface", mod)`
  keep working, and nothing is downloaded;
* `from kernels import get_kernel` / `import kernels`, once no other use is left ->
  `import _tb_flash_attention` (the `kernels` package is not needed);
* the shim file is added (shim_added), set to the target's operator.

Blockers: `get_kernel` of any other repository (a downloaded binary with no replacement),
the FlashAttention-2 package (`flash_attn`, another signature), an interface attribute the
shim lacks, and call arguments the shim does not support (seqused_q/k, qv, FP8 descales,
attention_chunk, softcap).
"""

from __future__ import annotations

import re

import libcst as cst

from ...pysource.imports import ensure_imports
from ...pysource.shapes import dotted
from ...pysource.syntax import code
from ..port_models import PortTarget
from ..registry import target_spec
from ..shims import flash_attention as _shim
from . import FeatureResult
from ._attention_port import (
    Recorder,
    literal_value,
    run,
    shim_module,
    unparseable,
    with_shim,
)

SHIM = "flash_attention"
INTERFACE = "flash_attn_interface"
SHIM_API = frozenset(_shim.__all__)
FA3_REPO = re.compile(r"flash[-_]?att(n|ention)[-_]?3", re.I)
FUNCS = ("flash_attn_varlen_func", "flash_attn_func")
# FA3's positional order after (q, k, v[, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k])
_VARLEN_TAIL = ("seqused_q", "seqused_k", "softmax_scale", "causal", "qv", "q_descale", "k_descale", "v_descale",
                "window_size", "attention_chunk", "softcap")
_FIXED_TAIL = ("softmax_scale", "causal", "qv", "q_descale", "k_descale", "v_descale", "window_size",
               "attention_chunk", "softcap")
_MUST_BE_NONE = ("seqused_q", "seqused_k", "qv", "q_descale", "k_descale", "v_descale")
_MUST_BE_ZERO = ("attention_chunk", "softcap")
_NOTE = ("FlashAttention-3 -> per-document SDPA (cpu) / npu_fusion_attention TND (npu) with FA3's causal "
         "window, same return value")


def _repo(call: cst.Call) -> str | None:
    first = next((a.value for a in call.args if a.keyword is None), None)
    if first is None:
        first = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "repo_id"), None)
    value = literal_value(first) if first is not None else ...
    return value if isinstance(value, str) else None


class _Bindings(cst.CSTVisitor):
    """What the program binds: FA3 names and modules, `get_kernel`, and whether every get_kernel is FA3."""

    def __init__(self):
        super().__init__()
        self.functions: set[str] = set()          # local names of FA3 functions
        self.get_kernel: set[str] = set()         # local names of kernels.get_kernel
        self.kernels_modules: set[str] = set()    # local names of the kernels package
        self.interfaces: set[str] = {INTERFACE}   # names holding an FA3 interface / kernel module
        self.other_get_kernel = False             # a get_kernel call we cannot replace
        self.other_kernels_use = False            # kernels.<anything but get_kernel>
        self.fa3_used = False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        mod = code(node.module) if node.module else ""
        if isinstance(node.names, cst.ImportStar):
            return
        for a in node.names:
            name, local = code(a.name), code(a.asname.name) if a.asname else code(a.name)
            if mod == INTERFACE:
                self.fa3_used = True
                if name in FUNCS:
                    self.functions.add(local)
            elif mod == "kernels":
                if name == "get_kernel":
                    self.get_kernel.add(local)
                else:
                    self.other_kernels_use = True

    def visit_Import(self, node: cst.Import) -> None:
        for a in node.names:
            name = code(a.name)
            local = code(a.asname.name) if a.asname else name
            if name == INTERFACE:
                self.fa3_used = True
                self.interfaces.add(local)
            elif name == "kernels":
                self.kernels_modules.add(local)

    def is_get_kernel(self, func) -> bool:
        if isinstance(func, cst.Name):
            return func.value in self.get_kernel
        return isinstance(func, cst.Attribute) and func.attr.value == "get_kernel" \
            and dotted(func.value) in self.kernels_modules

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_get_kernel(node.func):
            repo = _repo(node)
            if repo is not None and FA3_REPO.search(repo):
                self.fa3_used = True
            else:
                self.other_get_kernel = True

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if dotted(node.value) in self.kernels_modules and node.attr.value != "get_kernel":
            self.other_kernels_use = True

    def visit_Assign(self, node: cst.Assign) -> None:
        """x = get_kernel(FA3)[.flash_attn_interface] / getattr(<interface>, ...): x holds an interface."""
        v = node.value
        holds = False
        if isinstance(v, cst.Attribute) and v.attr.value == INTERFACE:
            v = v.value
            holds = isinstance(v, cst.Name) and v.value in self.interfaces
        if isinstance(v, cst.Call) and (self.is_get_kernel(v.func) or (
                isinstance(v.func, cst.Name) and v.func.value == "getattr" and v.args
                and dotted(v.args[0].value) in self.interfaces)):
            holds = True
        if holds:
            for t in node.targets:
                if isinstance(t.target, cst.Name):
                    self.interfaces.add(t.target.value)


class _Porter(Recorder):
    def __init__(self, file: str, b: _Bindings):
        super().__init__(file)
        self.b = b
        self.shim = shim_module(SHIM)
        self.replaced_get_kernel = False
        self.drop_kernels_import = not b.other_get_kernel and not b.other_kernels_use

    def visit_Import(self, node) -> bool:
        return False

    def visit_ImportFrom(self, node) -> bool:
        return False

    def leave_Import(self, original: cst.Import, updated: cst.Import):
        names, changed = [], False
        for a in updated.names:
            name = code(a.name)
            if name == INTERFACE:
                local = code(a.asname.name) if a.asname else INTERFACE
                names.append(cst.ImportAlias(name=cst.Name(self.shim), asname=cst.AsName(name=cst.Name(local))))
                changed = True
            elif name == "kernels" and self.drop_kernels_import:
                names.append(cst.ImportAlias(name=cst.Name(self.shim)))
                changed = True
            else:
                names.append(a)
        if not changed:
            return updated
        new = updated.with_changes(names=[n.with_changes(comma=cst.MaybeSentinel.DEFAULT) for n in names])
        self.change(original, "attention_replaced", code(original), code(new), _NOTE)
        return new

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom):
        mod = code(original.module) if original.module else ""
        if mod.split(".")[0] == "flash_attn":
            self.block(original, code(original), "the FlashAttention-2 package (flash_attn): its signature differs "
                                                 "from FA3's (dropout_p, return values); no shim")
            return updated
        if mod == INTERFACE:
            if isinstance(original.names, cst.ImportStar):
                new = updated.with_changes(module=cst.Name(self.shim))
            else:
                missing = [code(a.name) for a in original.names if code(a.name) not in SHIM_API]
                if missing:
                    self.block(original, f"from {INTERFACE} import {', '.join(missing)}",
                               f"the shim provides {', '.join(sorted(SHIM_API))} only")
                    return updated
                new = updated.with_changes(module=cst.Name(self.shim))
            self.change(original, "attention_replaced", code(original), code(new), _NOTE)
            return new
        if mod == "kernels" and self.drop_kernels_import and not isinstance(original.names, cst.ImportStar) \
                and all(code(a.name) == "get_kernel" for a in original.names):
            new = cst.Import(names=[cst.ImportAlias(name=cst.Name(self.shim))])
            self.change(original, "attention_replaced", code(original), code(new),
                        "the kernels package downloads FA3 at run time: the local shim replaces it")
            return new
        return updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        if isinstance(original.value, cst.Name) and original.value.value in self.b.interfaces \
                and original.attr.value not in SHIM_API:
            self.block(original, code(original), f"the shim provides {', '.join(sorted(SHIM_API))} only")
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.b.is_get_kernel(original.func):
            repo = _repo(original)
            if repo is None or not FA3_REPO.search(repo):
                self.block(original, code(original), "get_kernel downloads a binary kernel at run time and only "
                                                     "FlashAttention-3 has a local replacement")
                return updated
            self.replaced_get_kernel = True
            self.change(original, "attention_replaced", code(original), self.shim,
                        f"{_NOTE}; nothing is downloaded (the shim is its own .flash_attn_interface)")
            return cst.Name(self.shim)
        func = original.func
        name = func.value if isinstance(func, cst.Name) and func.value in self.b.functions else (
            func.attr.value if isinstance(func, cst.Attribute) and func.attr.value in FUNCS else None)
        if name is not None:
            self._check_call(original, name)
        return updated

    def _check_call(self, call: cst.Call, name: str) -> None:
        if any(a.star for a in call.args):
            self.block(call, code(call), "arguments passed with * / **: cannot check them against the shim")
            return
        base = 7 if name == "flash_attn_varlen_func" else 3
        tail = _VARLEN_TAIL if name == "flash_attn_varlen_func" else _FIXED_TAIL
        given = {}
        positional = [a.value for a in call.args if a.keyword is None]
        for i, v in enumerate(positional[base:]):
            if i < len(tail):
                given[tail[i]] = v
        given.update({a.keyword.value: a.value for a in call.args if a.keyword is not None})
        for arg in _MUST_BE_NONE:
            if arg in given and literal_value(given[arg]) is not None:
                self.block(call, f"{name}({arg}={code(given[arg])})", f"{arg} is not supported by the shim")
        for arg in _MUST_BE_ZERO:
            if arg in given and literal_value(given[arg]) not in (0, 0.0, None):
                self.block(call, f"{name}({arg}={code(given[arg])})", f"{arg} is not supported by the shim")


def _port_file(rel: str, text: str):
    if not any(s in text for s in (INTERFACE, "get_kernel", "flash_attn")):
        return text, None, []
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as err:
        return text, None, [unparseable(rel, err)]
    b = _Bindings()
    module.visit(b)
    porter = _Porter(rel, b)
    new = run(text, porter)
    if porter.replaced_get_kernel:
        new = ensure_imports(cst.parse_module(new), [f"import {porter.shim}"]).code
    return new, porter, porter.blockers


def port(files: dict[str, str], target: PortTarget) -> FeatureResult:
    """The program with FlashAttention-3 replaced by the shim (module doc); cuda: unchanged."""
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
