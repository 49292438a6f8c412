"""Shape helpers: recognise one operation however it is spelled.

Recipes match the *shape* of the code, never a program's text, so these accept the usual
spellings of one operation (`x.pow(2)` / `x ** 2` / `x * x` / `torch.square(x)`; `F.relu` /
`torch.nn.functional.relu`; `dim=-1` / `(-1,)`) and read a call's arguments by keyword or
position.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import libcst as cst
import libcst.matchers as m

from .names import load_names
from .syntax import parens


def num(node) -> float | None:
    """The value of a numeric literal (with unary minus), else None."""
    node = strip_parens(node)
    if isinstance(node, (cst.Integer, cst.Float)):
        try:
            return float(node.evaluated_value)
        except Exception:
            return None
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        v = num(node.expression)
        return -v if v is not None else None
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Plus):
        return num(node.expression)
    return None


def strip_parens(node):
    if node is not None and getattr(node, "lpar", None) and not isinstance(node, cst.Tuple):
        return node.with_changes(lpar=[], rpar=[])
    return node


def call_name(node) -> str | None:
    """'mean' for x.mean(...), torch.mean(...), mean(...)."""
    if isinstance(node, cst.Call):
        f = node.func
        if isinstance(f, cst.Attribute):
            return f.attr.value
        if isinstance(f, cst.Name):
            return f.value
    return None


def dotted(node) -> str | None:
    """'torch.nn.functional.relu' for that attribute chain, 'relu' for a Name, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr.value}" if head else None
    return None


def kwarg(call: cst.Call, name: str):
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a.value
    return None


def positional(call: cst.Call) -> list[cst.BaseExpression]:
    return [a.value for a in call.args if a.keyword is None and not a.star]


def arg(call: cst.Call, index: int, name: str):
    """Argument by keyword `name`, else the positional one at `index`."""
    v = kwarg(call, name)
    if v is not None:
        return v
    pos = positional(call)
    return pos[index] if index < len(pos) else None


TORCH_ROOTS = {"torch", "F", "nn", "functional"}


def is_module_call(call: cst.Call, names: set[str], roots: set[str] = TORCH_ROOTS) -> bool:
    """torch.X(...) / F.X(...) / torch.nn.functional.X(...) for X in names (not a tensor method)."""
    f = call.func
    if isinstance(f, cst.Attribute) and f.attr.value in names:
        d = dotted(f.value)
        return d is not None and d.split(".")[0] in roots
    return isinstance(f, cst.Name) and f.value in names


def method_receiver(call: cst.Call, names: set[str]):
    """X for X.name(...) where X is not a torch namespace, else None."""
    f = call.func
    if isinstance(f, cst.Attribute) and f.attr.value in names:
        d = dotted(f.value)
        if d is not None and d.split(".")[0] in TORCH_ROOTS:
            return None
        return f.value
    return None


def is_true(node) -> bool:
    return m.matches(node, m.Name("True"))


def dim_is_last(node) -> bool:
    """-1, (-1,), [-1]."""
    node = strip_parens(node)
    if num(node) == -1:
        return True
    if isinstance(node, (cst.Tuple, cst.List)) and len(node.elements) == 1:
        return num(node.elements[0].value) == -1
    return False


def flatten_mul(node) -> list:
    """Factors of a product chain a * b * c (parentheses ignored)."""
    node = strip_parens(node)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return flatten_mul(node.left) + flatten_mul(node.right)
    return [node]


def product(factors: Sequence[cst.BaseExpression]) -> cst.BaseExpression:
    out = parens(factors[0])
    for f in factors[1:]:
        out = cst.BinaryOperation(left=out, operator=cst.Multiply(), right=parens(f))
    return out


def contains_name(node: cst.CSTNode, names: Iterable[str]) -> bool:
    want = set(names)
    return any(n in want for n in load_names(node))
