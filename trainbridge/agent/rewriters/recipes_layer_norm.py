"""layer_norm_fused (L2): a hand-written LayerNorm as the fused LayerNorm operator.

Recognised by what the expression computes (`by_value`), not by its spelling: the mean and
variance as `x.mean(-1, keepdim=True)` and `x.var(-1, keepdim=True, unbiased=False)`, or the
variance as the mean of squared deviations, `(x - mu) / torch.sqrt(var + eps)` or
`(x - mu) * torch.rsqrt(var + eps)`, with or without a weight and a bias, over one statement
or several. The expression's operands are given roles - the input, the weight, the bias, the
eps (an operand such as `self.eps`, or a number written in place) - and every assignment of
roles is evaluated in float64 on random values and compared with `F.layer_norm` over the last
dimension; the one that agrees within 1e-9 names the call's arguments. A normalisation over
another dimension, the unbiased variance, or eps outside the root do not agree and are left
alone (the near-miss tests show each).

Every target: `F.layer_norm(x, (x.size(-1),), weight, bias, eps)` (on the NPU the native
operator is the fused LayerNorm kernel).
"""

from __future__ import annotations

import itertools

import libcst as cst
import torch

from ...pysource.syntax import code, expr
from .by_value import arithmetic_of, evaluate
from .expr_engine import Env, ExprRecipe, Match

_D = 16
_TOLERANCE = 1e-9
_EPS_OPERAND = 1e-3  # the value an eps operand takes in the trial: large enough that its place shows


def _trial_values(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 5, _D, generator=g, dtype=torch.float64) * 2.0 + 0.7
    w = torch.rand(_D, generator=g, dtype=torch.float64) + 0.5
    b = torch.randn(_D, generator=g, dtype=torch.float64)
    return x, w, b


def layer_norm_roles(text: str, variables: list[str], literals: list[str]) -> dict[str, str] | None:
    """Which variable is the input, weight, bias and eps (eps may be a literal) when the
    arithmetic is a LayerNorm over the last dimension; None when no assignment agrees."""
    if "_mean" not in text:
        return None
    x, w, b = _trial_values()
    eps_literals = [lit for lit in dict.fromkeys(literals) if 0 < _number(lit) < 1e-1]
    for roles in _assignments(variables):
        values = {v: {"input": x, "weight": w, "bias": b, "eps": _EPS_OPERAND}[role] for v, role in roles.items()}
        got = evaluate(text, values)
        if got is None or got.shape != x.shape:
            continue
        role_of = {role: v for v, role in roles.items()}
        weight, bias = (w if "weight" in role_of else None), (b if "bias" in role_of else None)
        eps_choices = [("operand", _EPS_OPERAND)] if "eps" in role_of else [(lit, _number(lit)) for lit in eps_literals]
        for eps_text, eps in eps_choices:
            want = torch.nn.functional.layer_norm(x, (_D,), weight, bias, eps)
            if (got - want).abs().max() < _TOLERANCE:
                return {**role_of, **({} if eps_text == "operand" else {"eps_literal": eps_text})}
    return None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _assignments(variables: list[str]):
    """Each way to give the operands roles: exactly one input; weight, bias, eps at most once each."""
    others = ("weight", "bias", "eps")
    for x in variables:
        rest = [v for v in variables if v != x]
        if len(rest) > len(others):
            continue
        for roles in itertools.permutations(others, len(rest)):
            yield {x: "input", **dict(zip(rest, roles))}


class LayerNormRecipe(ExprRecipe):
    def match(self, node, env: Env):
        found = arithmetic_of(node, env, (cst.Multiply, cst.Divide, cst.Add))
        if found is None:
            return None
        arithmetic, text = found
        here = env.ref(node)
        operands = list(arithmetic.operands.values())
        if not 1 <= len(operands) <= 4:
            return None
        roles = layer_norm_roles(text, [o.variable for o in operands], arithmetic.literals)
        if roles is None:
            return None
        by_variable = {o.variable: o for o in operands}
        written = {}
        for role in ("input", "weight", "bias", "eps"):
            if role in roles:
                refs = by_variable[roles[role]].refs
                w = env.scope.emit(refs[0], here)
                if w is None:
                    return None  # an operand with effects that another statement evaluates
                written[role] = code(w)
        x = written["input"]
        eps = written.get("eps") or roles.get("eps_literal")
        args = [x, f"({x}.size(-1),)", written.get("weight", "None"), written.get("bias", "None"), eps]
        new = expr(f"{env.F}.layer_norm({', '.join(args)})")
        notes = [f"recognised by value: float64 trial equals F.layer_norm over the last dimension "
                 f"within {_TOLERANCE:g}"]
        return Match(node=node, new=new, used=arithmetic.used, notes=notes,
                     detail={"x": x, "weight": written.get("weight", ""), "bias": written.get("bias", ""),
                             "eps": eps})

    def _no_site_reason(self, files, target):
        return "layer_norm_fused: no expression computing LayerNorm over the last dimension by hand found"
