"""FP8 matmuls on targets without FP8: the target's fast 16-bit type instead.

Float8 dtypes (`torch.float8_e4m3fn`, `torch.float8_e5m2`, ...) become `torch.bfloat16`
and `torch._scaled_mm` becomes the `_tb_fp8` shim's 16-bit product with the same scales. The
one exception is `torch.finfo(torch.float8_*)`: the programs compute their scales from FP8's
range (448 for e4m3), and those numbers must stay what the program meant. Every edit is a
semantic change (no FP8 rounding or saturation any more), as the public NPU ports' bf16
matmuls were.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from ..port_models import PortChange, PortTarget
from ..registry import target_spec
from ..shims import SHIM_PREFIX, add_shim, shim_filename
from . import FeatureResult

SHIM = "fp8"
SHIM_MODULE = shim_filename(SHIM).removesuffix(".py")
FAST_16BIT = "bfloat16"


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node).strip()


class _Fp8(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, file: str):
        super().__init__()
        self.file = file
        self.changes: list[PortChange] = []
        self.uses_shim = False
        self._in_finfo = 0

    def _line(self, node) -> int:
        try:
            return self.get_metadata(PositionProvider, node).start.line
        except KeyError:
            return 0

    def visit_Call(self, node: cst.Call) -> None:
        if m.matches(node.func, m.Attribute(value=m.Name("torch"), attr=m.Name("finfo"))):
            self._in_finfo += 1

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if m.matches(original.func, m.Attribute(value=m.Name("torch"), attr=m.Name("finfo"))):
            self._in_finfo -= 1
            return updated
        if m.matches(original.func, m.Attribute(value=m.Name("torch"), attr=m.Name("_scaled_mm"))):
            self.uses_shim = True
            self.changes.append(PortChange(
                file=self.file, line=self._line(original), kind="fp8_to_16bit", before="torch._scaled_mm",
                after=f"{SHIM_MODULE}.scaled_mm", semantic_change=True,
                note="no FP8 GEMM on this target: a bf16 product with the same scales (the public NPU ports did so)"))
            return updated.with_changes(func=cst.Attribute(value=cst.Name(SHIM_MODULE), attr=cst.Name("scaled_mm")))
        return updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        if self._in_finfo or not m.matches(original.value, m.Name("torch")) or \
                not original.attr.value.startswith("float8_"):
            return updated
        self.changes.append(PortChange(
            file=self.file, line=self._line(original), kind="fp8_to_16bit", before=_code(original),
            after=f"torch.{FAST_16BIT}", semantic_change=True,
            note="FP8 dtype: the target's fast 16-bit type holds the same scaled values (no FP8 rounding/saturation)"))
        return cst.Attribute(value=cst.Name("torch"), attr=cst.Name(FAST_16BIT))


def port(files: dict[str, str], target: PortTarget) -> FeatureResult:
    if target_spec(target).source_device:
        return FeatureResult(files=dict(files))
    out, changes, shim = {}, [], False
    for rel, text in files.items():
        if not rel.endswith(".py") or rel.startswith(SHIM_PREFIX) or ("float8" not in text and "_scaled_mm" not in text):
            out[rel] = text
            continue
        tr = _Fp8(rel)
        new = MetadataWrapper(cst.parse_module(text)).visit(tr)
        if tr.uses_shim:
            from ...pysource.imports import ensure_imports

            new = ensure_imports(new, [f"import {SHIM_MODULE}"])
            shim = True
        out[rel] = new.code
        changes.extend(tr.changes)
    if shim:
        out = add_shim(out, SHIM)
        changes.append(PortChange(file=shim_filename(SHIM), line=1, kind="shim_added", before="",
                                  after=shim_filename(SHIM), note="torch._scaled_mm as a 16-bit matmul"))
    return FeatureResult(files=out, changes=changes)
