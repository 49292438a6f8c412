"""relu2_fused (L5): relu(x)^2 as a custom autograd function with a one-kernel backward.

Recognised: the square (`.square()`, `.pow(2)`, `** 2`, `torch.square`, `r * r`) of a relu
(`F.relu(x)`, `torch.relu(x)`, `x.relu()`), chained or split over statements. In-place relus
(`inplace=True`) are left alone: the rewrite would stop modifying `x`.

Why a custom autograd function and not a cheaper plain-PyTorch form: none exists. Measured
on this project's CPU (2 cores, [2048, 1024], forward + backward, median of 55 interleaved
runs, single thread): `F.relu(x).square()`, `.pow(2)`, `r * r` and `x * F.relu(x)` all cost
the same or more (fp32 ~3.4-3.8 ms p10, bf16 ~1.75 ms); the eager backward runs
pow_backward (2*r*g) and then threshold_backward. Since relu(x)^2' = 2*relu(x) wherever x > 0
and 0 elsewhere, `2 * relu(x) * g` already is the whole gradient: the function saves relu(x)
once and skips threshold_backward (fp32 ~1.9 ms, bf16 ~1.4 ms: 1.25-2x). The gradient is
bit-identical (a multiply by 2 is exact). This is ladder level L5 (custom autograd function),
not L2/L3, because no fused operator or equivalent plain form is cheaper. It applies to
every target: on npu/cuda it also removes one kernel launch per MLP backward.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ...pysource.scope import Ref
from ...pysource.shapes import call_name, is_module_call, is_true, kwarg, method_receiver, positional, strip_parens
from ...pysource.syntax import code, expr
from .expr_engine import Env, ExprRecipe, Match
from .recipes_norm import square_base

RELU2_HELPER = '''
class _TbReluSquare(torch.autograd.Function):
    """relu(x) ** 2 saving relu(x) once; backward 2 * relu(x) * grad (no threshold_backward)."""

    @staticmethod
    def forward(ctx, x):
        r = torch.relu(x)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    def backward(ctx, grad):
        (r,) = ctx.saved_tensors
        return (r * grad).mul_(2.0)


def _tb_relu_square(x):
    return _TbReluSquare.apply(x)
'''


def relu_arg(ref: Ref, used: set) -> Ref | None:
    r = ref.scope.follow(ref, used)
    n = strip_parens(r.node)
    if not (isinstance(n, cst.Call) and call_name(n) == "relu"):
        return None
    if is_true(kwarg(n, "inplace")):
        return None
    recv = method_receiver(n, {"relu"})
    if recv is not None:
        return r.with_node(recv) if not n.args else None
    pos = positional(n)
    if not is_module_call(n, {"relu"}) or not pos or len(pos) > 2 or (len(pos) == 2 and not m.matches(pos[1], m.Name("False"))):
        return None
    return r.with_node(pos[0])


class Relu2Recipe(ExprRecipe):
    def match(self, node, env: Env):
        if not isinstance(node, (cst.Call, cst.BinaryOperation)):
            return None
        here = env.ref(node)
        used: set = set()
        base = square_base(here, used)
        if base is None:
            return None
        x_ref = relu_arg(base, used)
        if x_ref is None:
            return None
        x = env.scope.emit(x_ref, here)
        stmt_edits = []
        if x is None:
            # relu(<a module call>) assigned to a name in an earlier statement: keep that statement
            # (without the relu) and square-relu the name here, so the call runs once
            hoist = self._hoist(base, x_ref, env, here, used)
            if hoist is None:
                return None
            x, stmt_edits, used = hoist
        new = expr(f"_tb_relu_square({code(x)})")
        return Match(node=node, new=new, used=used, helpers=[("_tb_relu_square", RELU2_HELPER)], stmt_edits=stmt_edits,
                     notes=["custom autograd function: forward relu + mul, backward one fused 2*r*g; "
                            "double backward through it is not supported (training needs first order only)"],
                     detail={"x": code(x)})

    def _hoist(self, base: Ref, x_ref: Ref, env: Env, here: Ref, used: set):
        scope = env.scope
        name = strip_parens(base.node)
        if not isinstance(name, cst.Name):
            return None
        hit = scope.lookup(name.value, here.at)
        if hit is None or hit[1] is not scope or hit[0].value is None:
            return None
        d = hit[0]
        relu_call = d.value
        # the relu's result may be read only by this square
        from ...pysource.names import load_names
        if not (d.index < here.at) or any(load_names(scope.stmts[i])[name.value] for i in range(d.index + 1, here.at)):
            return None
        nxt = [x.index for x in scope.defs.get(name.value, []) if x.index > d.index]
        if not nxt or nxt[0] != here.at:  # the square must rebind the name, or later reads would see no relu
            return None
        return cst.Name(name.value), [(relu_call, x_ref.node)], set()

    def _no_site_reason(self, files, target):
        return "relu2_fused: no relu(x)^2 (square / pow(2) / ** 2 / r * r of a non-inplace relu) found"
