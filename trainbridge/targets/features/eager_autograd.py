"""autograd.Function backward passes that only a compiled program gets away with.

Under `torch.compile` a custom `autograd.Function` whose `backward` returns fewer gradients
than `forward` takes inputs has run in the records (the compiled graph never checks the
count); eager autograd refuses it ("returned an incorrect number of gradients"). The naive
port runs eager, so each such `return` gets trailing `None`s up to forward's parameter count
(eager autograd accepts extra trailing Nones for inputs a call did not pass).
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ..port_models import PortChange, PortTarget
from ..registry import target_spec
from ..shims import SHIM_PREFIX
from . import FeatureResult


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node).strip()


def _is_function_class(cls: cst.ClassDef) -> bool:
    return any(_code(b.value).split(".")[-1] == "Function" for b in cls.bases)


def _forward_inputs(cls: cst.ClassDef) -> int | None:
    for stmt in cls.body.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "forward":
            if not isinstance(stmt.params.star_arg, cst.MaybeSentinel) and stmt.params.star_arg is not None:
                return None  # *args: the count is the caller's
            return len(stmt.params.params) + len(stmt.params.kwonly_params) - 1  # minus ctx
    return None


class _PadBackward(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, file: str):
        super().__init__()
        self.file = file
        self.changes: list[PortChange] = []
        self._want: list[int | None] = []
        self._in_backward = 0

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._want.append(_forward_inputs(node) if _is_function_class(node) else None)

    def leave_ClassDef(self, original, updated):
        self._want.pop()
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == "backward" and self._want and self._want[-1]:
            self._in_backward += 1

    def leave_FunctionDef(self, original, updated):
        if original.name.value == "backward" and self._want and self._want[-1]:
            self._in_backward -= 1
        return updated

    def leave_Return(self, original: cst.Return, updated: cst.Return):
        if not self._in_backward or not isinstance(updated.value, cst.Tuple):
            return updated
        want = self._want[-1]
        have = len(updated.value.elements)
        if any(isinstance(e, cst.StarredElement) for e in updated.value.elements) or have >= want:
            return updated
        elements = [*updated.value.elements[:-1], updated.value.elements[-1].with_changes(comma=cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" ")))]
        elements += [cst.Element(cst.Name("None"), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                     for _ in range(want - have - 1)] + [cst.Element(cst.Name("None"))]
        new = updated.with_changes(value=updated.value.with_changes(elements=elements))
        self.changes.append(PortChange(
            file=self.file, line=self.get_metadata(PositionProvider, original).start.line, kind="eager_autograd",
            before=_code(original), after=_code(new),
            note=f"backward returned {have} gradients for {want} forward inputs: eager autograd needs them all "
                 "(torch.compile did not check); the added ones are None"))
        return new


def port(files: dict[str, str], target: PortTarget) -> FeatureResult:
    if target_spec(target).source_device:
        return FeatureResult(files=dict(files))
    out, changes = {}, []
    for rel, text in files.items():
        if not rel.endswith(".py") or rel.startswith(SHIM_PREFIX) or "def backward" not in text:
            out[rel] = text
            continue
        tr = _PadBackward(rel)
        new = MetadataWrapper(cst.parse_module(text)).visit(tr)
        out[rel] = new.code if tr.changes else text
        changes.extend(tr.changes)
    return FeatureResult(files=out, changes=changes)
