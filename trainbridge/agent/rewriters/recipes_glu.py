"""swiglu_fused / geglu_fused (L2): a gated linear unit, `act(a) * b`, as the fused operator.

Feed-forward blocks gate one projection by another: SwiGLU `silu(a) * b` (Llama, Mistral) and
GeGLU `gelu(a) * b` (T5 v1.1, PaLM-style stacks). Programs spell both halves many ways: two
projections (`F.silu(self.w1(x)) * self.w3(x)`), one projection chunked (`a, b =
self.w12(x).chunk(2, dim=-1)` or sliced at half the last dimension), the activation called
(`F.silu`, `F.gelu(approximate=...)`) or written by hand (`a * torch.sigmoid(a)`, `a / (1 +
torch.exp(-a))`, any spelling of GELU). The activation is recognised by value as in
`recipes_gelu`: an arithmetic expression of one operand evaluated in float64 on [-6, 6] and
compared with SiLU and both GELU forms.

- npu: `torch_npu.npu_swiglu(x, dim=-1)` when the gate and the value are the first and second
  halves of one tensor `x`; else `npu_swiglu(torch.cat([a, b], dim=-1), dim=-1)` (the cat is a
  copy: a smaller saving, measured like any other). GeGLU: `npu_geglu(x, dim=-1,
  approximate=0|1, activate_left=...)[0]`; the default activates the right half, and
  `activate_left=True` (the left) needs a torch_npu built on aclnnGeGluV3 (catalog note).
- cpu / cuda: torch has no fused gated unit, so only a hand-written SiLU becomes `F.silu(a)`
  (one operator and one backward instead of sigmoid, mul and their backwards). A program
  that already calls `F.silu` has nothing to change there; compile_region covers the block.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import torch

from ...pysource.shapes import call_name, kwarg, positional, strip_parens
from ...pysource.scope import Ref
from ...pysource.syntax import code, expr
from .by_value import Arithmetic, NotArithmetic, arithmetic_of, evaluate, literal_text
from .expr_engine import Env, ExprRecipe, Match
from .recipes_rotary import half_of

_POINTS = torch.linspace(-6.0, 6.0, 241, dtype=torch.float64)
_TOLERANCE = 1e-9
_REFERENCE = {
    "silu": torch.nn.functional.silu(_POINTS),
    "gelu:tanh": torch.nn.functional.gelu(_POINTS, approximate="tanh"),
    "gelu:none": torch.nn.functional.gelu(_POINTS),
}
_FUNCTIONAL = ("F", "torch.nn.functional", "nn.functional", "torch")


def activation_by_value(text: str, variable: str) -> str | None:
    """'silu', 'gelu:tanh' or 'gelu:none' when the arithmetic over `variable` equals that activation."""
    values = evaluate(text, {variable: _POINTS})
    if values is None or values.shape != _POINTS.shape or not torch.isfinite(values).all():
        return None
    for name, reference in _REFERENCE.items():
        if (values - reference).abs().max() < _TOLERANCE:
            return name
    return None


def _called_activation(n: cst.Call) -> tuple[str, cst.BaseExpression] | None:
    """`F.silu(a)`, `torch.nn.functional.gelu(a, approximate="tanh")`: (activation, a)."""
    name = call_name(n)
    if name not in ("silu", "gelu") or not isinstance(n.func, cst.Attribute):
        return None
    if code(n.func.value) not in _FUNCTIONAL:
        return None
    pos = positional(n)
    if len(pos) != 1 or kwarg(n, "inplace") is not None:
        return None
    if name == "silu":
        return "silu", pos[0]
    approximate = kwarg(n, "approximate")
    if approximate is None:
        return "gelu:none", pos[0]
    value = strip_parens(approximate)
    if isinstance(value, cst.SimpleString) and value.evaluated_value in ("tanh", "none"):
        return f"gelu:{value.evaluated_value}", pos[0]
    return None


def activation_of(ref: Ref, env: Env, used: set) -> tuple[str, Ref, bool] | None:
    """(activation, its operand, written by hand) for an expression that applies SiLU or GELU
    to one operand, read through local names; None otherwise."""
    trial: set = set()
    r = ref.scope.follow(ref, trial)
    n = strip_parens(r.node)
    if isinstance(n, cst.Call) and (called := _called_activation(n)) is not None:
        used |= trial
        return called[0], r.with_node(called[1]), False
    if not isinstance(n, cst.BinaryOperation) or not isinstance(n.operator, (cst.Multiply, cst.Divide)):
        return None
    arithmetic = Arithmetic(env)
    try:
        text = arithmetic.source(r.with_node(n))
    except NotArithmetic:
        return None
    if len(arithmetic.operands) != 1:
        return None
    operand = next(iter(arithmetic.operands.values()))
    if "_sigmoid" not in text and "_exp" not in text and "_tanh" not in text and "_erf" not in text:
        return None
    name = activation_by_value(text, operand.variable)
    if name is None:
        return None
    used |= trial | arithmetic.used
    return name, operand.refs[0], True


@dataclass
class GatedUnitRecipe(ExprRecipe):
    """`act(a) * b` with act = SiLU (swiglu_fused) or GELU (geglu_fused)."""

    activation: str = "silu"  # "silu" | "gelu"

    def match(self, node, env: Env):
        if env.target == "npu":
            return self._npu(node, env)
        if self.activation == "silu":
            return self._hand_silu(node, env)
        return None

    # ------------------------------------------------------------ cpu / cuda ----
    def _hand_silu(self, node, env: Env):
        found = arithmetic_of(node, env, (cst.Multiply, cst.Divide))
        if found is None:
            return None
        arithmetic, text = found
        if len(arithmetic.operands) != 1 or ("_sigmoid" not in text and "_exp" not in text):
            return None
        operand = next(iter(arithmetic.operands.values()))
        if activation_by_value(text, operand.variable) != "silu":
            return None
        written = [env.scope.emit(r, env.ref(node)) for r in operand.refs]
        if any(w is None for w in written):
            return None
        a = code(written[0])
        return Match(node=node, new=expr(f"{env.F}.silu({a})"), used=arithmetic.used,
                     notes=[f"recognised by value: float64 on [-6, 6] equals SiLU within {_TOLERANCE:g}"],
                     detail={"a": a, "activation": "silu", "form": "hand-written silu"})

    # ------------------------------------------------------------ npu ----
    def _npu(self, node, env: Env):
        if not isinstance(node, cst.BinaryOperation) or not isinstance(node.operator, cst.Multiply):
            return None
        here = env.ref(node)
        for gate, value in ((node.left, node.right), (node.right, node.left)):
            used: set = set()
            found = activation_of(here.with_node(gate), env, used)
            if found is None or not found[0].startswith(self.activation):
                continue
            name, a_ref, by_hand = found
            b_ref = here.with_node(value)
            if literal_text(value) is not None or isinstance(strip_parens(value), cst.Attribute) \
                    or env.scope.same(a_ref, b_ref):
                continue  # a scale (a number, a parameter), or the gate's own operand: not a gated unit
            return self._npu_call(node, env, name, a_ref, b_ref, used, by_hand)
        return None

    def _npu_call(self, node, env: Env, name: str, a_ref: Ref, b_ref: Ref, used: set, by_hand: bool):
        here = env.ref(node)
        halves: set = set()
        ha, hb = half_of(a_ref, halves), half_of(b_ref, halves)
        gelu = name.startswith("gelu")
        approximate = "1" if name == "gelu:tanh" else "0"
        notes = [f"activation {'written by hand, recognised by value' if by_hand else 'called'}: {name}"]
        one_tensor = ha is not None and hb is not None and ha[1] != hb[1] and env.scope.same(ha[0], hb[0])
        # the halved tensor written here; None when that would call a module again (`a, b =
        # self.w12(x).chunk(2, -1)`): then the halves stay and are joined like two tensors
        x = env.scope.emit(ha[0], here) if one_tensor else None
        if x is not None:
            used |= halves
            left = ha[1] == 0  # the gate is the first half
            if not gelu:
                if not left:
                    return None  # npu_swiglu activates the first half; silu(second) * first is left alone
                new = f"torch_npu.npu_swiglu({code(x)}, dim=-1)"
            else:
                new = (f"torch_npu.npu_geglu({code(x)}, dim=-1, approximate={approximate}"
                       + (", activate_left=True" if left else "") + ")[0]")
                if left:
                    notes.append("activate_left=True needs a torch_npu built on aclnnGeGluV3")
            form = "one tensor in halves"
        else:
            a, b = env.scope.emit(a_ref, here), env.scope.emit(b_ref, here)
            if a is None or b is None:
                return None
            joined = f"torch.cat([{code(a)}, {code(b)}], dim=-1)"
            if not gelu:
                new = f"torch_npu.npu_swiglu({joined}, dim=-1)"
            else:
                new = f"torch_npu.npu_geglu({joined}, dim=-1, approximate={approximate}, activate_left=True)[0]"
                notes.append("activate_left=True needs a torch_npu built on aclnnGeGluV3")
            notes.append("two tensors joined by torch.cat (a copy) for the fused operator")
            form = "two tensors"
        return Match(node=node, new=expr(new), used=used, imports=["import torch", "import torch_npu"], notes=notes,
                     detail={"activation": name, "form": form})

    def _no_site_reason(self, files, target):
        if target == "npu":
            return f"{self.name}: no {self.activation}(a) * b gated unit found"
        return f"{self.name}: no hand-written SiLU found (a program calling F.silu has nothing to fuse on {target})"


__all__ = ["GatedUnitRecipe", "activation_by_value", "activation_of"]
