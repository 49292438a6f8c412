"""rotary_complex_fused (npu, L2): rotary embeddings written with complex numbers, as npu_rotary_mul.

Meta's Llama code and its many descendants rotate interleaved pairs (x[..., 2j], x[..., 2j+1])
as complex numbers:

    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)

With f = cos + i sin per pair, (a + ib)(cos + i sin) = (a cos - b sin) + i(a sin + b cos),
which is `x * R1 + rotate_interleave(x) * R2` with rotate_interleave(x) = [-b, a] per pair,
R1 = cos and R2 = sin each repeated twice along the last dimension: npu_rotary_mul's
'interleave' mode. So the view_as_real(view_as_complex(x) * f).flatten(...) expression becomes

    torch_npu.npu_rotary_mul(x.float(), f.real.repeat_interleave(2, dim=-1),
                             f.imag.repeat_interleave(2, dim=-1), rotary_mode="interleave")

one fused operator in place of the complex multiply and the views around it (and their
backward). The tables are built from `f` as written at the call (its broadcast shape, e.g.
(1, T, 1, D/2) -> (1, T, 1, D)), so they always match the program's own frequencies; the
input keeps the program's float32 upcast. npu_rotary_mul needs 4-D input with D even and
< 896: the dry run's reference checks it and refuses the candidate otherwise.

cpu / cuda: not offered. torch computes the complex product there as one kernel between two
free views, so there is nothing of this form to fuse.
"""

from __future__ import annotations

import libcst as cst

from ...pysource.shapes import call_name, is_module_call, method_receiver, num, positional, strip_parens
from ...pysource.scope import Ref
from ...pysource.syntax import code, expr, parens
from .expr_engine import Env, ExprRecipe, Match

_CASTS = {"float", "to", "type_as"}


def _flatten_of_view_as_real(n) -> cst.BaseExpression | None:
    """P for `torch.view_as_real(P).flatten(3 | -2)` / `torch.flatten(torch.view_as_real(P), 3 | -2)`."""
    if not isinstance(n, cst.Call) or call_name(n) != "flatten":
        return None
    receiver = method_receiver(n, {"flatten"})
    pos = positional(n)
    if receiver is not None and not (isinstance(receiver, cst.Name) and receiver.value == "torch"):
        inner, start = receiver, (pos[0] if pos else None)
    elif is_module_call(n, {"flatten"}) and pos:
        inner, start = pos[0], (pos[1] if len(pos) > 1 else None)
    else:
        return None
    if start is None or num(start) not in (3, -2):
        return None
    inner = strip_parens(inner)
    if not (isinstance(inner, cst.Call) and is_module_call(inner, {"view_as_real"}) and len(positional(inner)) == 1):
        return None
    return positional(inner)[0]


def _pairs_source(ref: Ref, used: set) -> Ref | None:
    """x for `torch.view_as_complex(x[.float()].reshape(*x.shape[:-1], -1, 2))` (or `.view`), read
    through a local name."""
    trial: set = set()
    r = ref.scope.follow(ref, trial)
    n = strip_parens(r.node)
    if not (isinstance(n, cst.Call) and is_module_call(n, {"view_as_complex"}) and len(positional(n)) == 1):
        return None
    shaped = strip_parens(positional(n)[0])
    if not (isinstance(shaped, cst.Call) and call_name(shaped) in ("reshape", "view")):
        return None
    base = method_receiver(shaped, {"reshape", "view"})
    sizes = positional(shaped)
    if base is None or len(sizes) < 2 or num(sizes[-1]) != 2 or num(sizes[-2]) != -1:
        return None
    while isinstance(strip_parens(base), cst.Call) and call_name(strip_parens(base)) in _CASTS:
        cast = strip_parens(base)
        inner = method_receiver(cast, _CASTS)
        if inner is None:
            return None
        base = inner
    used |= trial
    return r.with_node(base)


class ComplexRotaryRecipe(ExprRecipe):
    def match(self, node, env: Env):
        if env.target != "npu":
            return None
        product = _flatten_of_view_as_real(strip_parens(node)) if isinstance(node, cst.Call) else None
        if product is None:
            return None
        here = env.ref(node)
        trial: set = set()
        p = env.scope.follow(here.with_node(product), trial)
        pn = strip_parens(p.node)
        if not (isinstance(pn, cst.BinaryOperation) and isinstance(pn.operator, cst.Multiply)):
            return None
        for pairs, freqs in ((pn.left, pn.right), (pn.right, pn.left)):
            used = set(trial)
            x_ref = _pairs_source(p.with_node(pairs), used)
            if x_ref is None or _pairs_source(p.with_node(freqs), set()) is not None:
                continue
            x = env.scope.emit(x_ref, here)
            f = env.scope.emit(p.with_node(freqs), here)
            if x is None or f is None:
                return None
            fx = code(parens(f)) if not isinstance(strip_parens(f), (cst.Name, cst.Attribute)) else code(f)
            new = expr(f"torch_npu.npu_rotary_mul({code(parens(x))}.float(), {fx}.real.repeat_interleave(2, dim=-1), "
                       f"{fx}.imag.repeat_interleave(2, dim=-1), rotary_mode=\"interleave\")")
            return Match(node=node, new=new, used=used, imports=["import torch_npu"],
                         notes=["complex rotary of interleaved pairs = npu_rotary_mul(x, cos, sin) in 'interleave' "
                                "mode with each table repeated twice along the last dimension"],
                         detail={"x": code(x), "freqs": code(f)})
        return None

    def _no_site_reason(self, files, target):
        return ("rotary_complex_fused: no view_as_real(view_as_complex(x.reshape(..., -1, 2)) * freqs).flatten(...) "
                "rotary found")


__all__ = ["ComplexRotaryRecipe"]
