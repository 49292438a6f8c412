"""Recognise a computation by what it computes, not by how it is spelled.

Programs written elsewhere spell one computation many ways (a GELU's constant written out or
computed, a LayerNorm's variance as `var(unbiased=False)` or as the mean of squared
deviations, split over statements or not). Matching each spelling is a losing game; this
module instead writes an expression as Python over its *operands* - the sub-expressions that
are not arithmetic (a name, `self.weight`, a module call) - following local names whose values
are arithmetic, so a recipe can evaluate it on chosen float64 values and compare it with the
operation it might be (`recipes_gelu`, `recipes_layer_norm`).

Arithmetic is: numbers, `math.pi`-like constants, unary and binary + - * / **, and calls of
the functions in `FUNCTIONS` (torch.f(x, ...), x.f(...), math.f(...)) whose keyword arguments
are literals; casts (`.float()`, `.type_as(t)`, `.to(...)`) are the identity in float64.
Evaluation runs the text with only those functions in scope.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import libcst as cst
import torch

from ...pysource.scope import Ref
from ...pysource.shapes import call_name, method_receiver, positional, strip_parens
from ...pysource.syntax import code
from .expr_engine import Env

FUNCTIONS = {"tanh", "erf", "sigmoid", "pow", "sqrt", "rsqrt", "exp", "mean", "var", "square", "abs", "sum"}
CASTS = {"float", "type_as", "to", "double", "bfloat16", "half"}
CONSTANTS = {"math.pi": "math.pi", "torch.pi": "math.pi", "np.pi": "math.pi", "numpy.pi": "math.pi",
             "math.e": "math.e"}
_OPERATORS = {cst.Add: "+", cst.Subtract: "-", cst.Multiply: "*", cst.Divide: "/", cst.Power: "**"}
_MODULES = ("torch", "math", "np", "numpy")


class NotArithmetic(Exception):
    pass


@dataclass
class Operand:
    """One operand of the expression: its variable in the text, and where it appears."""

    variable: str
    refs: list[Ref] = field(default_factory=list)


def literal_text(node) -> str | None:
    """A keyword argument's value when it is a literal (number, True/False/None, tuple of them)."""
    n = strip_parens(node)
    if isinstance(n, (cst.Integer, cst.Float)):
        return n.value
    if isinstance(n, cst.UnaryOperation) and isinstance(n.operator, cst.Minus) and literal_text(n.expression):
        return f"-{literal_text(n.expression)}"
    if isinstance(n, cst.Name) and n.value in ("True", "False", "None"):
        return n.value
    if isinstance(n, (cst.Tuple, cst.List)):
        parts = [literal_text(e.value) for e in n.elements]
        return None if any(p is None for p in parts) else f"({', '.join(parts)},)"
    return None


class Arithmetic:
    """Writes an expression as Python over `_v0, _v1, ...` (its operands, by canonical text)."""

    def __init__(self, env: Env, follow: bool = True):
        self.env = env
        self.follow = follow  # read local names through (False: every name is an operand)
        self.operands: dict[str, Operand] = {}  # canonical text -> operand
        self.used: set = set()
        self.literals: list[str] = []  # numeric literals seen, in order (an eps written in place)

    def source(self, ref: Ref, depth: int = 0) -> str:
        if depth > 60:
            raise NotArithmetic("too deep")
        n = strip_parens(ref.node)
        if isinstance(n, (cst.Integer, cst.Float)):
            self.literals.append(n.value)
            return f"({n.value})"
        if isinstance(n, cst.Attribute) and code(n) in CONSTANTS:
            return CONSTANTS[code(n)]
        if isinstance(n, cst.UnaryOperation) and isinstance(n.operator, (cst.Minus, cst.Plus)):
            sign = "-" if isinstance(n.operator, cst.Minus) else "+"
            return f"({sign}{self.source(ref.with_node(n.expression), depth + 1)})"
        if isinstance(n, cst.BinaryOperation) and type(n.operator) in _OPERATORS:
            left = self.source(ref.with_node(n.left), depth + 1)
            right = self.source(ref.with_node(n.right), depth + 1)
            return f"({left} {_OPERATORS[type(n.operator)]} {right})"
        if isinstance(n, cst.Call) and (text := self._call(ref, n, depth)) is not None:
            return text
        if isinstance(n, cst.Name) and self.follow and (followed := self._follow(ref, depth)) is not None:
            return followed
        return self._operand(ref)

    def _call(self, ref: Ref, n: cst.Call, depth: int) -> str | None:
        name = call_name(n)
        receiver = method_receiver(n, {name}) if name else None
        on_module = receiver is not None and isinstance(receiver, cst.Name) and receiver.value in _MODULES
        if name in CASTS and receiver is not None and not on_module:
            return self.source(ref.with_node(receiver), depth + 1)  # the identity in float64
        if name not in FUNCTIONS:
            return None
        args = ([] if receiver is None or on_module else [receiver]) + positional(n)
        keywords = []
        for a in n.args:
            if a.keyword is not None:
                value = literal_text(a.value)
                if value is None:
                    raise NotArithmetic(f"{code(n)}: keyword {a.keyword.value} is not a literal")
                keywords.append(f"{a.keyword.value}={value}")
        if not args:
            raise NotArithmetic(code(n))
        first = self.source(ref.with_node(args[0]), depth + 1)
        rest = []
        for a in args[1:]:  # a dim or an exponent: a literal, or arithmetic (pow's exponent)
            rest.append(literal_text(a) or self.source(ref.with_node(a), depth + 1))
        return f"_{name}({', '.join([first, *rest, *keywords])})"

    def _operand(self, ref: Ref) -> str:
        canon = ref.scope.canon(ref)
        op = self.operands.get(canon)
        if op is None:
            op = self.operands[canon] = Operand(variable=f"_v{len(self.operands)}")
        op.refs.append(ref)
        return op.variable

    def _follow(self, ref: Ref, depth: int) -> str | None:
        """A local name bound to arithmetic over operands is read through (its statement becomes
        used up); a constant is read through and its statement stays; anything else is an operand."""
        n = strip_parens(ref.node)
        hit = ref.scope.lookup(n.value, ref.at)
        if hit is None or hit[0].value is None:
            return None
        d, scope = hit
        trial = Arithmetic(self.env)
        try:
            text = trial.source(Ref(d.value, scope, d.index), depth + 1)
        except NotArithmetic:
            return None
        if not trial.operands:
            return text
        if len(trial.operands) == 1 and text == next(iter(trial.operands.values())).variable:
            return None  # a plain alias: the name is the operand
        mapping = {}
        for canon, op in trial.operands.items():
            mine = self.operands.get(canon)
            if mine is None:
                mine = self.operands[canon] = Operand(variable=f"_v{len(self.operands)}")
            mine.refs.extend(op.refs)
            mapping[op.variable] = mine.variable
        text = re.sub(r"_v\d+", lambda m: mapping[m.group()], text)  # one pass: no renaming twice
        self.used |= trial.used | {(id(scope), d.index)}
        self.literals.extend(trial.literals)
        return text


def arithmetic_of(node, env: Env, operators: tuple[type, ...], *,
                  follow: bool = True) -> tuple[Arithmetic, str] | None:
    """The arithmetic of a binary expression whose top operator is one of `operators` (the
    matcher's first filter), or None when it is not arithmetic. `follow=False` stops at local
    names: `x = bias + y` then `x * 0.5 * (1 + erf(x / sqrt 2))` is GELU of `x`, where read
    through it would be arithmetic over `bias` and `y`."""
    if not isinstance(node, cst.BinaryOperation) or not isinstance(node.operator, operators):
        return None
    arithmetic = Arithmetic(env, follow)
    try:
        return arithmetic, arithmetic.source(env.ref(node))
    except NotArithmetic:
        return None


def _as_tensor(v):
    return v if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float64)


_NAMESPACE = {
    "math": math,
    "_tanh": lambda v: torch.tanh(_as_tensor(v)), "_erf": lambda v: torch.erf(_as_tensor(v)),
    "_sigmoid": lambda v: torch.sigmoid(_as_tensor(v)),
    "_exp": lambda v: torch.exp(_as_tensor(v)), "_sqrt": lambda v: torch.sqrt(_as_tensor(v)),
    "_rsqrt": lambda v: torch.rsqrt(_as_tensor(v)), "_abs": lambda v: torch.abs(_as_tensor(v)),
    "_square": lambda v: torch.square(_as_tensor(v)),
    "_pow": lambda a, b: torch.pow(_as_tensor(a), b),
    "_mean": lambda v, *a, **k: torch.mean(_as_tensor(v), *a, **k),
    "_sum": lambda v, *a, **k: torch.sum(_as_tensor(v), *a, **k),
    "_var": lambda v, *a, **k: torch.var(_as_tensor(v), *a, **k),
}


def evaluate(text: str, values: dict[str, object]) -> torch.Tensor | None:
    """The expression's value with its operands bound to `values` (None if it does not evaluate)."""
    try:
        out = eval(text, {"__builtins__": {}}, {**_NAMESPACE, **values})  # noqa: S307 - arithmetic only
    except Exception:
        return None
    return out if isinstance(out, torch.Tensor) else None
