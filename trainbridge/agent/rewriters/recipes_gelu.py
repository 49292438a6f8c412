"""gelu_fused (L2): a hand-written GELU as the fused GELU operator.

Recognised by what the expression computes, not by how it is spelled. Programs write GELU
many ways: `0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))`,
with `torch.pow(x, 3.0)`, `x * x * x`, the constant 0.7978845608 written out, the factors in
another order, `x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))`, split over statements. So
the matcher only checks that an expression is arithmetic over one operand `x` (`by_value`:
after following local names whose values are arithmetic too), then evaluates it in float64
on points across
[-6, 6] and compares with GELU's two forms: the tanh approximation and the exact erf form
(they differ by up to ~5e-4 there, far above the 1e-9 they are held to, so the form is never
mistaken).

cpu / cuda: `F.gelu(x, approximate="tanh")` or `F.gelu(x)`; npu: `torch_npu.npu_gelu(x,
approximate=...)`, because the native F.gelu there ignores `approximate` (npu catalog note).
"""

from __future__ import annotations

import libcst as cst
import torch

from ...pysource.syntax import code, expr
from .by_value import arithmetic_of, evaluate
from .expr_engine import Env, ExprRecipe, Match

_POINTS = torch.linspace(-6.0, 6.0, 241, dtype=torch.float64)
_TOLERANCE = 1e-9


def gelu_form(text: str, variable: str = "_v0") -> str | None:
    """'tanh' or 'none' (erf) when the arithmetic over `variable` is GELU, else None."""
    if "_tanh" not in text and "_erf" not in text:
        return None
    values = evaluate(text, {variable: _POINTS})
    if values is None or values.shape != _POINTS.shape or not torch.isfinite(values).all():
        return None
    for form in ("tanh", "none"):
        if (values - torch.nn.functional.gelu(_POINTS, approximate=form)).abs().max() < _TOLERANCE:
            return form
    return None


class GeluRecipe(ExprRecipe):
    def match(self, node, env: Env):
        for follow in (True, False):  # through local names first; else names as they stand (by_value)
            found = arithmetic_of(node, env, (cst.Multiply, cst.Divide), follow=follow)
            if found is None:
                return None
            arithmetic, text = found
            if len(arithmetic.operands) != 1:
                continue  # GELU has one operand
            operand = next(iter(arithmetic.operands.values()))
            if (form := gelu_form(text, operand.variable)) is not None:
                break
        else:
            return None
        here = env.ref(node)
        written = [env.scope.emit(r, here) for r in operand.refs]
        if any(w is None for w in written):
            return None  # an operand with effects that another statement evaluates: not written twice
        x = code(written[0])
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
