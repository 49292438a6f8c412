"""Precision choices written on the device's abilities, read as the GPU read them.

Programs pick their precision by asking the device, e.g.
`dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float16'`.
The naive cpu port answers `torch.cuda.is_available()` with False, which silently turns that
line into float16 and a GradScaler: another precision than the GPU ran, and one the port never
reports. Here a conditional expression whose test asks the device (availability, bf16 support)
and whose branches name a dtype is evaluated with the GPU's answers (True), so the port keeps
the GPU's precision choice, and says so.

Whether that dtype then reaches the math on the target (an autocast on a device chosen at run
time, say) is the porter's `precision_lost` note, not decided here.
"""

from __future__ import annotations

import libcst as cst

from ..pysource.shapes import dotted
from ..pysource.syntax import code

DEVICE_QUERIES = {"torch.cuda.is_available", "torch.cuda.is_bf16_supported"}
"""Calls whose answer on the GPU the program was written for is True."""

_DTYPE_STRINGS = {"bfloat16", "float16", "float32", "bf16", "fp16", "fp32", "half", "float"}
_DTYPE_ATTRS = {"bfloat16", "float16", "half", "float32", "float"}


def names_a_dtype(node: cst.BaseExpression) -> bool:
    """A string like 'bfloat16' or an attribute like torch.float16."""
    if isinstance(node, cst.SimpleString):
        try:
            return node.evaluated_value in _DTYPE_STRINGS
        except Exception:
            return False
    d = dotted(node)
    return d is not None and d.startswith("torch.") and d.split(".")[-1] in _DTYPE_ATTRS


def asks_the_device(test: cst.BaseExpression) -> bool:
    return any(q in code(test) for q in DEVICE_QUERIES)


class _AsOnTheGpu(cst.CSTTransformer):
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        return cst.Name("True") if dotted(original.func) in DEVICE_QUERIES else updated


def _literal_truth(node: cst.BaseExpression) -> bool | None:
    """The value of a test made only of True/False, and/or/not and parentheses; else None."""
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        inner = _literal_truth(node.expression)
        return None if inner is None else not inner
    if isinstance(node, cst.BooleanOperation):
        left, right = _literal_truth(node.left), _literal_truth(node.right)
        if left is None or right is None:
            return None
        return (left and right) if isinstance(node.operator, cst.And) else (left or right)
    return None


def gpu_branch(node: cst.IfExp) -> cst.BaseExpression | None:
    """The branch the GPU took in a dtype choice on the device's abilities, or None when `node`
    is not such a choice or its test depends on more than the device's answers."""
    if not asks_the_device(node.test) or not (names_a_dtype(node.body) or names_a_dtype(node.orelse)):
        return None
    truth = _literal_truth(node.test.visit(_AsOnTheGpu()))
    if truth is None:
        return None
    return node.body if truth else node.orelse
