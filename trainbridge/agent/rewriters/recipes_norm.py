"""rms_norm_fused (L2): a hand-written RMSNorm as one fused operator.

Recognised (after following local names): a product containing `x` and an inverse root of
`mean(x^2, last dim, keepdim=True) + eps`, with or without further factors:

    x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)          # function or method
    var = (h * h).mean(dim=-1, keepdim=True); return h * torch.rsqrt(var + self.eps) * self.weight
    x / torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + eps)
    x * (torch.square(x).mean(-1, keepdim=True) + eps) ** -0.5

cpu / cuda: `F.rms_norm(x, (x.size(-1),), weight, eps)`. The program's eps is always passed:
F.rms_norm's default (None) means the dtype's machine epsilon, not the program's value.
A factor is fused as the weight only when it is `self.<p>` with `self.<p> = nn.Parameter(
torch.ones(dim))`-like in `__init__` (its shape must be the normalized shape); any other
factor stays an explicit multiply after the fused norm.

npu: `torch_npu.npu_rms_norm(x, gamma, epsilon=eps)[0]`; gamma is the weight cast to x's
dtype (the op wants them equal; under autocast x is often bf16 and the weight fp32), or a
cached all-ones vector when the norm has no weight.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ...pysource.names import load_names
from ...pysource.scope import Ref, _has_effects
from ...pysource.shapes import (
    call_name,
    dim_is_last,
    flatten_mul,
    is_module_call,
    is_true,
    kwarg,
    method_receiver,
    num,
    positional,
    product,
    strip_parens,
)
from ...pysource.sites import self_attribute_value
from ...pysource.syntax import code, expr, parens
from .expr_engine import Env, ExprRecipe, Match

CPU_WEIGHTED_HELPER = '''
def _tb_rms_norm(x, weight, eps):
    """Fused RMSNorm with the program's weight; keeps the eager chain's dtype promotion.

    F.rms_norm fuses the weight only when it has x's dtype; with a different dtype (an fp32
    weight on a bf16 activation under autocast) the eager chain promoted to the weight's
    dtype, so the weight is applied after the fused normalization instead.
    """
    if weight.dtype == x.dtype:
        return {F}.rms_norm(x, (x.size(-1),), weight, eps)
    return {F}.rms_norm(x, (x.size(-1),), None, eps) * weight
'''

NPU_GAMMA_HELPER = '''
_TB_NPU_RMS_GAMMA = {}


def _tb_npu_rms_gamma(x):
    """All-ones gamma for npu_rms_norm when the program's norm has no weight (cached per shape/dtype/device)."""
    key = (x.size(-1), x.dtype, x.device)
    gamma = _TB_NPU_RMS_GAMMA.get(key)
    if gamma is None:
        gamma = _TB_NPU_RMS_GAMMA[key] = torch.ones(x.size(-1), dtype=x.dtype, device=x.device)
    return gamma
'''


def square_base(ref: Ref, used: set) -> Ref | None:
    """X for X.pow(2), X ** 2, X * X, torch.square(X), X.square(), torch.pow(X, 2)."""
    ref = ref.scope.follow(ref, used)
    n = strip_parens(ref.node)
    if isinstance(n, cst.BinaryOperation):
        if isinstance(n.operator, cst.Power) and num(n.right) == 2:
            return ref.with_node(n.left)
        if isinstance(n.operator, cst.Multiply) and ref.scope.same(ref.with_node(n.left), ref.with_node(n.right)):
            return ref.with_node(n.left)
        return None
    if isinstance(n, cst.Call):
        name = call_name(n)
        recv = method_receiver(n, {"pow", "square"})
        if recv is not None:
            if name == "square" and not n.args:
                return ref.with_node(recv)
            if name == "pow" and len(n.args) == 1 and num(n.args[0].value) == 2:
                return ref.with_node(recv)
            return None
        if is_module_call(n, {"square"}) and len(n.args) == 1:
            return ref.with_node(n.args[0].value)
        if is_module_call(n, {"pow"}) and len(n.args) == 2 and num(n.args[1].value) == 2:
            return ref.with_node(n.args[0].value)
    return None


def mean_last_arg(ref: Ref, used: set) -> Ref | None:
    """A for A.mean(-1, keepdim=True) / torch.mean(A, dim=-1, keepdim=True) (also dim=(-1,))."""
    ref = ref.scope.follow(ref, used)
    n = strip_parens(ref.node)
    if not (isinstance(n, cst.Call) and call_name(n) == "mean") or kwarg(n, "dtype") is not None:
        return None
    recv = method_receiver(n, {"mean"})
    pos = positional(n)
    if recv is not None:
        a, rest = recv, pos
    elif is_module_call(n, {"mean"}) and pos:
        a, rest = pos[0], pos[1:]
    else:
        return None
    dim = kwarg(n, "dim") if kwarg(n, "dim") is not None else (rest[0] if rest else None)
    keep = kwarg(n, "keepdim") if kwarg(n, "keepdim") is not None else (rest[1] if len(rest) > 1 else None)
    if dim is None or not dim_is_last(dim) or not is_true(keep):
        return None
    return ref.with_node(a)


def inverse_root_arg(ref: Ref, used: set) -> Ref | None:
    """V for rsqrt(V), V.rsqrt(), V ** -0.5, torch.pow(V, -0.5), V.pow(-0.5), 1 / sqrt(V)."""
    ref = ref.scope.follow(ref, used)
    n = strip_parens(ref.node)
    if isinstance(n, cst.Call):
        recv = method_receiver(n, {"rsqrt", "pow"})
        if recv is not None:
            if call_name(n) == "rsqrt" and not n.args:
                return ref.with_node(recv)
            if call_name(n) == "pow" and len(n.args) == 1 and num(n.args[0].value) == -0.5:
                return ref.with_node(recv)
            return None
        if is_module_call(n, {"rsqrt"}) and len(n.args) == 1:
            return ref.with_node(n.args[0].value)
        if is_module_call(n, {"pow"}) and len(n.args) == 2 and num(n.args[1].value) == -0.5:
            return ref.with_node(n.args[0].value)
        return None
    if isinstance(n, cst.BinaryOperation):
        if isinstance(n.operator, cst.Power) and num(n.right) == -0.5:
            return ref.with_node(n.left)
        if isinstance(n.operator, cst.Divide) and num(n.left) == 1:
            return root_arg(ref.with_node(n.right), used)
    return None


def root_arg(ref: Ref, used: set) -> Ref | None:
    """V for torch.sqrt(V), V.sqrt(), V ** 0.5."""
    ref = ref.scope.follow(ref, used)
    n = strip_parens(ref.node)
    if isinstance(n, cst.Call):
        recv = method_receiver(n, {"sqrt"})
        if recv is not None and not n.args:
            return ref.with_node(recv)
        if is_module_call(n, {"sqrt"}) and len(n.args) == 1:
            return ref.with_node(n.args[0].value)
    if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Power) and num(n.right) == 0.5:
        return ref.with_node(n.left)
    return None


def mean_plus_eps(ref: Ref, used: set) -> tuple[Ref, Ref] | None:
    """(X, eps) for mean(X^2, -1, keepdim=True) + eps (either order, or .add(eps))."""
    ref = ref.scope.follow(ref, used)
    n = strip_parens(ref.node)
    pairs = []
    if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Add):
        pairs = [(n.left, n.right), (n.right, n.left)]
    elif isinstance(n, cst.Call) and call_name(n) == "add" and method_receiver(n, {"add"}) is not None and len(n.args) == 1:
        pairs = [(n.func.value, n.args[0].value)]
    for mean_node, eps_node in pairs:
        trial = set()
        a = mean_last_arg(ref.with_node(mean_node), trial)
        if a is None:
            continue
        x = square_base(a, trial)
        if x is None:
            continue
        used |= trial
        return x, ref.with_node(eps_node)
    return None


def match_rms_norm(node, env: Env):
    """(x_ref, weight_refs, other_factor_refs, eps_ref, used) or None."""
    scope = env.scope
    here = env.ref(node)
    n = strip_parens(node)
    used: set = set()
    if not isinstance(n, cst.BinaryOperation):
        return None
    if isinstance(n.operator, cst.Divide):
        v = root_arg(here.with_node(n.right), used)
        if v is None:
            return None
        factors = flatten_mul(n.left)
    elif isinstance(n.operator, cst.Multiply):
        factors = flatten_mul(n)
        v = None
        for f in factors:
            trial = set()
            v = inverse_root_arg(here.with_node(f), trial)
            if v is not None:
                used |= trial
                factors = [g for g in factors if g is not f]
                break
        if v is None:
            return None
    else:
        return None
    got = mean_plus_eps(v, used)
    if got is None:
        return None
    x_sq, eps = got
    x_ref = None
    for f in factors:
        if scope.same(here.with_node(f), x_sq):
            x_ref = here.with_node(f)
            break
    if x_ref is None:
        return None
    others = [here.with_node(f) for f in factors if f is not x_ref.node and num(f) != 1]
    x_names = set(load_names(scope.resolve(x_ref))) - {"self"}
    if x_names & set(load_names(scope.resolve(eps))):
        return None  # eps must not depend on x
    return x_ref, others, eps, used


def _is_vector_parameter(ref: Ref, env: Env) -> bool:
    """self.<p> where __init__ sets self.<p> = nn.Parameter(torch.ones(dim)) (or zeros/randn/empty)."""
    n = strip_parens(ref.node)
    if not m.matches(n, m.Attribute(value=m.Name("self"))):
        return False
    val = self_attribute_value(env.site.class_def, n.attr.value)
    if val is None:
        return False
    v = strip_parens(val.node)
    if not (isinstance(v, cst.Call) and call_name(v) == "Parameter" and v.args):
        return False
    inner = strip_parens(v.args[0].value)
    return isinstance(inner, cst.Call) and call_name(inner) in ("ones", "zeros", "randn", "empty", "rand") and \
        len(positional(inner)) == 1 and not isinstance(strip_parens(positional(inner)[0]), (cst.Tuple, cst.List))


class RmsNormRecipe(ExprRecipe):
    def match(self, node, env: Env):
        if not isinstance(node, cst.BinaryOperation):
            return None
        got = match_rms_norm(node, env)
        if got is None:
            return None
        x_ref, others, eps_ref, used = got
        scope, here = env.scope, env.ref(node)
        x = scope.emit(x_ref, here)
        eps = scope.emit(eps_ref, here)
        if x is None or eps is None or any(scope.emit(o, here) is None for o in others):
            return None
        pre = []
        if not isinstance(strip_parens(x), (cst.Name, cst.Attribute)):
            if _has_effects(x):
                return None
            pre = [cst.parse_statement(f"_tb_rms_x = {code(x)}\n")]
            x = cst.Name("_tb_rms_x")
        weight = None
        if len(others) == 1 and _is_vector_parameter(others[0], env):
            weight = scope.emit(others[0], here)
            others = []
        rest = [scope.emit(o, here) for o in others]
        xs, es = code(x), code(eps)
        imports, helpers, notes = [], [], []
        if env.target == "npu":
            gamma = f"{code(weight)}.to({xs}.dtype)" if weight is not None else f"_tb_npu_rms_gamma({xs})"
            new = expr(f"torch_npu.npu_rms_norm({xs}, {gamma}, epsilon={es})[0]")
            imports.append("import torch_npu")
            if weight is None:
                helpers.append(("_tb_npu_rms_gamma", NPU_GAMMA_HELPER))
            notes.append("npu_rms_norm wants gamma in x's dtype: the weight is cast to x.dtype (under autocast x is "
                         "often bf16 while the weight is fp32); the original promoted to fp32 instead")
        else:
            if weight is not None:
                new = expr(f"_tb_rms_norm({xs}, {code(weight)}, {es})")
                helpers.append(("_tb_rms_norm", CPU_WEIGHTED_HELPER.replace("{F}", env.F)))
            else:
                new = expr(f"{env.F}.rms_norm({xs}, ({xs}.size(-1),), None, {es})")
            notes.append("F.rms_norm computes in fp32 internally for bf16/fp16 inputs: a low-precision program's "
                         "norm output may differ from the eager chain in the last bf16 bit")
        if rest:
            new = product([new, *rest])
        new = parens(new) if getattr(node, "lpar", None) else new
        return Match(node=node, new=new, used=used, imports=imports, helpers=helpers, pre=pre, notes=notes,
                     detail={"x": xs, "eps": es, "weight": code(weight) if weight is not None else "",
                             "outer_factors": ", ".join(code(r) for r in rest)})

    def _no_site_reason(self, files, target):
        return ("rms_norm_fused: no hand-written RMSNorm (x * rsqrt(mean(x^2, -1, keepdim=True) + eps) [* w]) "
                "found; already fused norms (F.rms_norm, nn.RMSNorm) are left as they are")
