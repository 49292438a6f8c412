"""Shifts of unsigned tensors, which eager CPU kernels do not have, through the `_tb_bits` shim.

The records from 2026-01 on keep each bf16 parameter's lost mantissa in a uint16 buffer and
rebuild the fp32 value with `(p.to(torch.uint32) << 16) | mantissa`, inside a
`torch.compile`d function: Inductor generates the shift, eager PyTorch on the CPU has none
for uint16/32/64. In a file that names an unsigned dtype, every `<<` / `>>` (and `<<=` /
`>>=`) outside a Triton kernel becomes `_tb_bits.lshift(a, k)` / `rshift(a, k)`: the same
bits from a shift in int64 for an unsigned tensor, the plain operator for anything else. Not
a semantic change: the bits are identical (the shim's tests check every width).
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from ..port_models import PortChange, PortTarget
from ..registry import target_spec
from ..shims import SHIM_PREFIX, add_shim, shim_filename
from . import FeatureResult

SHIM = "bits"
SHIM_MODULE = shim_filename(SHIM).removesuffix(".py")
_UNSIGNED = re.compile(r"\btorch\.uint(16|32|64)\b")
_FUNCS = {"LeftShift": "lshift", "RightShift": "rshift",
          "LeftShiftAssign": "lshift", "RightShiftAssign": "rshift"}


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node).strip()


def _is_triton(fn: cst.FunctionDef) -> bool:
    return any("triton" in _code(d.decorator) for d in fn.decorators)


class _Shifts(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, file: str):
        super().__init__()
        self.file = file
        self.changes: list[PortChange] = []
        self._triton = 0

    def _line(self, node) -> int:
        try:
            return self.get_metadata(PositionProvider, node).start.line
        except KeyError:
            return 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._triton += _is_triton(node)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        self._triton -= _is_triton(original)
        return updated

    def _call(self, func: str, left: cst.BaseExpression, right: cst.BaseExpression) -> cst.Call:
        return cst.Call(func=cst.Attribute(value=cst.Name(SHIM_MODULE), attr=cst.Name(func)),
                        args=[cst.Arg(left), cst.Arg(right)])

    def _note(self, original: cst.CSTNode, after: str) -> None:
        self.changes.append(PortChange(
            file=self.file, line=self._line(original), kind="unsigned_shift", before=_code(original)[:120],
            after=after[:120], note="eager CPU kernels have no shift for uint16/32/64: the same bits via int64"))

    def leave_BinaryOperation(self, original: cst.BinaryOperation, updated: cst.BinaryOperation):
        func = _FUNCS.get(type(original.operator).__name__)
        if func is None or self._triton:
            return updated
        if m.matches(original.left, m.Integer()) and m.matches(original.right, m.Integer()):
            return updated  # a constant such as 1 << 16
        new = self._call(func, updated.left, updated.right)
        self._note(original, _code(new))
        return new

    def leave_AugAssign(self, original: cst.AugAssign, updated: cst.AugAssign):
        func = _FUNCS.get(type(original.operator).__name__)
        if func is None or self._triton:
            return updated
        new = cst.Assign(targets=[cst.AssignTarget(updated.target)], value=self._call(func, updated.target, updated.value))
        self._note(original, _code(new))
        return new


def port(files: dict[str, str], target: PortTarget) -> FeatureResult:
    if target_spec(target).source_device:
        return FeatureResult(files=dict(files))
    out, changes = {}, []
    for rel, text in files.items():
        if not rel.endswith(".py") or rel.startswith(SHIM_PREFIX) or not _UNSIGNED.search(text) \
                or ("<<" not in text and ">>" not in text):
            out[rel] = text
            continue
        tr = _Shifts(rel)
        new = MetadataWrapper(cst.parse_module(text)).visit(tr)
        if tr.changes:
            from ...pysource.imports import ensure_imports

            new = ensure_imports(new, [f"import {SHIM_MODULE}"])
        out[rel] = new.code
        changes.extend(tr.changes)
    if changes:
        out = add_shim(out, SHIM)
        changes.append(PortChange(file=shim_filename(SHIM), line=1, kind="shim_added", before="",
                                  after=shim_filename(SHIM), note="bit shifts of unsigned tensors via int64"))
    return FeatureResult(files=out, changes=changes)
