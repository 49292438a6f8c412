"""gelu_fused (L2): a hand-written GELU as the fused GELU operator.

Recognised by what the expression computes, not by how it is spelled. Programs write GELU
many ways: `0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))`,
with `torch.pow(x, 3.0)`, `x * x * x`, the constant 0.7978845608 written out, the factors in
another order, `x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))`, split over statements. So
the matcher only checks that an expression is arithmetic (+ - * / **, numbers, math/torch
pi, and tanh / erf / pow / sqrt / exp calls) over one operand `x` (after following local
names whose values are arithmetic too), then evaluates it in float64 on points across
[-6, 6] and compares with GELU's two forms: the tanh approximation and the exact erf form
(they differ by up to ~5e-4 there, far above the 1e-9 they are held to, so the form is never
mistaken).

cpu / cuda: `F.gelu(x, approximate="tanh")` or `F.gelu(x)`; npu: `torch_npu.npu_gelu(x,
approximate=...)`, because the native F.gelu there ignores `approximate` (npu catalog note).
"""

from __future__ import annotations

import math

import libcst as cst
import torch

from ...pysource.scope import Ref
from ...pysource.shapes import call_name, method_receiver, positional, strip_parens
from ...pysource.syntax import code, expr
from .expr_engine import Env, ExprRecipe, Match

_FUNCTIONS = {"tanh", "erf", "pow", "sqrt", "exp"}
_CONSTANTS = {"math.pi": "math.pi", "torch.pi": "math.pi", "np.pi": "math.pi", "numpy.pi": "math.pi",
              "math.e": "math.e"}
_OPERATORS = {cst.Add: "+", cst.Subtract: "-", cst.Multiply: "*", cst.Divide: "/", cst.Power: "**"}
_POINTS = torch.linspace(-6.0, 6.0, 241, dtype=torch.float64)
_TOLERANCE = 1e-9


class _NotArithmetic(Exception):
    pass


class _Arithmetic:
    """Writes an expression as Python over `_x`, following local names whose values are arithmetic."""

    def __init__(self, env: Env):
        self.env = env
        self.leaves: list[Ref] = []
        self.used: set = set()

    def source(self, ref: Ref, depth: int = 0) -> str:
        if depth > 40:
            raise _NotArithmetic("too deep")
        n = strip_parens(ref.node)
        if isinstance(n, (cst.Integer, cst.Float)):
            return f"({n.value})"
        if isinstance(n, cst.Attribute) and code(n) in _CONSTANTS:
            return _CONSTANTS[code(n)]
        if isinstance(n, cst.UnaryOperation) and isinstance(n.operator, (cst.Minus, cst.Plus)):
            sign = "-" if isinstance(n.operator, cst.Minus) else "+"
            return f"({sign}{self.source(ref.with_node(n.expression), depth + 1)})"
        if isinstance(n, cst.BinaryOperation) and type(n.operator) in _OPERATORS:
            left = self.source(ref.with_node(n.left), depth + 1)
            right = self.source(ref.with_node(n.right), depth + 1)
            return f"({left} {_OPERATORS[type(n.operator)]} {right})"
        if isinstance(n, cst.Call) and call_name(n) in _FUNCTIONS and not any(a.keyword for a in n.args):
            name = call_name(n)
            receiver = method_receiver(n, {name})
            args = ([receiver] if receiver is not None and not _is_module(receiver) else []) + positional(n)
            if name == "pow" and len(args) == 2 or name != "pow" and len(args) == 1:
                return f"_{name}({', '.join(self.source(ref.with_node(a), depth + 1) for a in args)})"
            raise _NotArithmetic(code(n))
        if isinstance(n, cst.Name) and (followed := self._follow(ref, depth)) is not None:
            return followed
        self.leaves.append(ref)
        return "_x"

    def _follow(self, ref: Ref, depth: int) -> str | None:
        """A local name bound to arithmetic is read through (its statement becomes used up); one
        bound to anything else is the operand itself."""
        n = strip_parens(ref.node)
        hit = ref.scope.lookup(n.value, ref.at)
        if hit is None or hit[0].value is None:
            return None
        d, scope = hit
        trial = _Arithmetic(self.env)
        try:
            text = trial.source(Ref(d.value, scope, d.index), depth + 1)
        except _NotArithmetic:
            return None
        if not trial.leaves:
            return text  # a constant (c = math.sqrt(2 / math.pi)): read through, its statement stays
        if text == "_x":
            return None  # a plain alias of the operand: the name is the operand
        self.leaves.extend(trial.leaves)
        self.used |= trial.used | {(id(scope), d.index)}
        return text


def _is_module(node) -> bool:
    return isinstance(node, cst.Name) and node.value in ("torch", "math", "np", "numpy")


def _evaluate(text: str) -> torch.Tensor | None:
    def as_tensor(v):
        return v if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float64)

    names = {"math": math, "_x": _POINTS,
             "_tanh": lambda v: torch.tanh(as_tensor(v)), "_erf": lambda v: torch.erf(as_tensor(v)),
             "_exp": lambda v: torch.exp(as_tensor(v)), "_sqrt": lambda v: torch.sqrt(as_tensor(v)),
             "_pow": lambda a, b: torch.pow(as_tensor(a), b)}
    try:
        out = eval(text, {"__builtins__": {}}, names)  # noqa: S307 - arithmetic over _x only (checked above)
    except Exception:
        return None
    return out if isinstance(out, torch.Tensor) and out.shape == _POINTS.shape else None


def gelu_form(text: str) -> str | None:
    """'tanh' or 'none' (erf) when the arithmetic over `_x` is GELU, else None."""
    if "_tanh" not in text and "_erf" not in text:
        return None
    values = _evaluate(text)
    if values is None or not torch.isfinite(values).all():
        return None
    for form in ("tanh", "none"):
        if (values - torch.nn.functional.gelu(_POINTS, approximate=form)).abs().max() < _TOLERANCE:
            return form
    return None


class GeluRecipe(ExprRecipe):
    def match(self, node, env: Env):
        if not isinstance(node, cst.BinaryOperation) or not isinstance(node.operator, (cst.Multiply, cst.Divide)):
            return None
        here = env.ref(node)
        arithmetic = _Arithmetic(env)
        try:
            text = arithmetic.source(here)
        except _NotArithmetic:
            return None
        form = gelu_form(text)
        if form is None or not arithmetic.leaves:
            return None
        operands = [env.scope.emit(leaf, here) for leaf in arithmetic.leaves]
        if any(o is None for o in operands) or len({code(o) for o in operands}) != 1:
            return None  # more than one operand, or one that cannot be written here once
        x = code(operands[0])
        if env.target == "npu":
            new = expr(f'torch_npu.npu_gelu({x}, approximate="{form}")')
            imports = ["import torch_npu"]
            notes = ["npu_gelu with the program's form: the native F.gelu on the NPU ignores approximate"]
        else:
            new = expr(f'{env.F}.gelu({x}, approximate="tanh")' if form == "tanh" else f"{env.F}.gelu({x})")
            imports, notes = [], []
        notes.append(f"recognised by value: float64 on [-6, 6] equals GELU ({form}) within {_TOLERANCE:g}")
        return Match(node=node, new=new, used=arithmetic.used, imports=imports, notes=notes,
                     detail={"x": x, "approximate": form})

    def _no_site_reason(self, files, target):
        return "gelu_fused: no expression computing GELU (tanh or erf form) by hand found"
