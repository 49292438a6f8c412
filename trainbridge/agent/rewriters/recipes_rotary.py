"""rotary_fused: hand-written half-split rotary embeddings in fewer passes.

Recognised (after following local names): the two halves of the last dimension of one
tensor `x` (`x[..., :d]` / `x[..., d:]` with `d = x.shape[-1] // 2`, or `x.chunk(2, dim=-1)`)
combined as

    y1 = x1 * a1 + x2 * b1 ;  y2 = x1 * a2 + x2 * b2 ;  torch.cat([y1, y2], dim=-1)

where each coefficient is any expression that does not involve x (cos, sin, -sin, ...), each
term may be negated and `+` may be `-`. Both common sign conventions (GPT-NeoX
`x1*cos - x2*sin`, Modded-NanoGPT `x1*cos + x2*sin`) are special cases. On npu the standard
`x * cos + rotate_half(x) * sin` with full-width tables is recognised too.

Math. With rotate_half(x) = [-x2, x1] (the convention of npu_rotary_mul's 'half' mode),
x*R1 + rotate_half(x)*R2 = [x1*R1a - x2*R2a, x2*R1b + x1*R2b], so the concat form is
R1 = [a1, b2], R2 = [-b1, a2]. With swap(x) = [x2, x1] = x.roll(d, -1),
x*S1 + swap(x)*S2 = [x1*S1a + x2*S2a, x2*S1b + x1*S2b], so S1 = [a1, b2], S2 = [b1, a2].

npu (L2): `torch_npu.npu_rotary_mul(x, R1, R2)` (4-D input, D even and < 896; the tables are
cast to x's dtype). cpu / cuda (L3, equivalent rewrite): `x * S1 + x.roll(d, -1) * S2`:
one full-width roll instead of two half slices, four half-width multiplies, two adds and a
cat; every output element is computed with the same products and the same single add, so
the result is bit-identical. Measured on this project's CPU (2 cores, fp32 and bf16, B8 T256
H4 D64, forward+backward): ~1.5x faster than the hand-written form.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ...pysource.names import load_names
from ...pysource.scope import ITEM, Ref, _has_effects
from ...pysource.shapes import (
    call_name,
    is_module_call,
    kwarg,
    method_receiver,
    num,
    positional,
    strip_parens,
    dim_is_last,
)
from ...pysource.sites import iter_functions, function_params
from ...pysource.syntax import code, expr, parens
from .expr_engine import Env, ExprRecipe, Match


def _ellipsis_slice(sub: cst.Subscript):
    """(lower, upper) of x[..., lower:upper] (no step), else None."""
    if len(sub.slice) != 2 or not isinstance(sub.slice[0].slice, cst.Index) or \
            not isinstance(sub.slice[0].slice.value, cst.Ellipsis) or not isinstance(sub.slice[1].slice, cst.Slice):
        return None
    s = sub.slice[1].slice
    if s.step is not None:
        return None
    return s.lower, s.upper


def _is_half_of(d_ref: Ref, x_ref: Ref, used: set) -> bool:
    """d is x.shape[-1] // 2 or x.size(-1) // 2 (of the same x)."""
    scope = d_ref.scope
    d = scope.follow(d_ref, used)
    n = strip_parens(d.node)
    if not (isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.FloorDivide) and num(n.right) == 2):
        return False
    left = scope.follow(d.with_node(n.left), used)
    ln = strip_parens(left.node)
    base = None
    if isinstance(ln, cst.Subscript) and m.matches(ln.value, m.Attribute(attr=m.Name("shape"))) and len(ln.slice) == 1 \
            and isinstance(ln.slice[0].slice, cst.Index) and num(ln.slice[0].slice.value) == -1:
        base = ln.value.value
    elif isinstance(ln, cst.Call) and call_name(ln) == "size" and method_receiver(ln, {"size"}) is not None \
            and len(ln.args) == 1 and num(ln.args[0].value) == -1:
        base = ln.func.value
    return base is not None and scope.same(left.with_node(base), x_ref)


def half_of(ref: Ref, used: set) -> tuple[Ref, int] | None:
    """(x, 0|1) when ref is the first/second half of x's last dimension."""
    scope = ref.scope
    trial = set()
    r = scope.follow(ref, trial)
    n = strip_parens(r.node)
    if isinstance(n, cst.Subscript):
        bounds = _ellipsis_slice(n)
        if bounds is None:
            return None
        x = r.with_node(n.value)
        lower, upper = bounds
        if lower is None and upper is not None and _is_half_of(r.with_node(upper), x, trial):
            used |= trial
            return x, 0
        if upper is None and lower is not None and _is_half_of(r.with_node(lower), x, trial):
            used |= trial
            return x, 1
        return None
    if isinstance(n, cst.Call) and m.matches(n.func, m.Name(ITEM)):
        src = scope.follow(r.with_node(n.args[0].value), trial)
        k = int(num(n.args[1].value))
        c = strip_parens(src.node)
        if isinstance(c, cst.Call) and call_name(c) == "chunk":
            recv = method_receiver(c, {"chunk"})
            pos = positional(c)
            if recv is not None:
                x, chunks, dim = recv, (pos[0] if pos else kwarg(c, "chunks")), (kwarg(c, "dim") or (pos[1] if len(pos) > 1 else None))
            elif is_module_call(c, {"chunk"}) and pos:
                x, chunks, dim = pos[0], (pos[1] if len(pos) > 1 else kwarg(c, "chunks")), (kwarg(c, "dim") or (pos[2] if len(pos) > 2 else None))
            else:
                return None
            if num(chunks) == 2 and dim is not None and dim_is_last(dim) and k in (0, 1):
                used |= trial
                return src.with_node(x), k
    return None


def _signed(ref: Ref, used: set) -> tuple[Ref, int]:
    """(inner, sign) stripping unary minus (through names)."""
    sign = 1
    for _ in range(4):
        r = ref.scope.follow(ref, used) if isinstance(strip_parens(ref.node), cst.Name) else ref
        n = strip_parens(r.node)
        if isinstance(n, cst.UnaryOperation) and isinstance(n.operator, cst.Minus):
            sign, ref = -sign, r.with_node(n.expression)
            continue
        return ref, sign
    return ref, sign


def term(ref: Ref, used: set):
    """(x, half, coef_ref, sign) for +-(half * coef), coefficient free of x."""
    scope = ref.scope
    trial = set()
    inner, sign = _signed(ref, trial)
    r = scope.follow(inner, trial)
    n = strip_parens(r.node)
    if not (isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Multiply)):
        return None
    for a, b in ((n.left, n.right), (n.right, n.left)):
        ha, sa = _signed(r.with_node(a), trial)
        h = half_of(ha, trial)
        if h is None:
            continue
        coef, sc = _signed(r.with_node(b), trial)
        xs = set(load_names(scope.resolve(h[0]))) - {"self"}
        if xs & set(load_names(scope.resolve(coef))):
            return None
        used |= trial
        return h[0], h[1], coef, sign * sa * sc
    return None


def linear_pair(ref: Ref, used: set):
    """{half: (coef_ref, sign)} and x for t0 +- t1 over both halves of one x."""
    scope = ref.scope
    trial = set()
    r = scope.follow(ref, trial)
    n = strip_parens(r.node)
    if not (isinstance(n, cst.BinaryOperation) and isinstance(n.operator, (cst.Add, cst.Subtract))):
        return None
    t0 = term(r.with_node(n.left), trial)
    t1 = term(r.with_node(n.right), trial)
    if t0 is None or t1 is None:
        return None
    if isinstance(n.operator, cst.Subtract):
        t1 = (t1[0], t1[1], t1[2], -t1[3])
    if {t0[1], t1[1]} != {0, 1} or not scope.same(t0[0], t1[0]):
        return None
    used |= trial
    coefs = {t0[1]: (t0[2], t0[3]), t1[1]: (t1[2], t1[3])}
    return t0[0], coefs


def _cat_parts(n: cst.Call):
    """[a, b] for torch.cat([a, b], dim=-1) / torch.cat((a, b), -1)."""
    if not is_module_call(n, {"cat", "concat", "concatenate"}):
        return None
    pos = positional(n)
    if not pos:
        return None
    seq = strip_parens(pos[0])
    dim = kwarg(n, "dim") if kwarg(n, "dim") is not None else (pos[1] if len(pos) > 1 else None)
    if not isinstance(seq, (cst.List, cst.Tuple)) or len(seq.elements) != 2 or dim is None or not dim_is_last(dim):
        return None
    if any(isinstance(e, cst.StarredElement) for e in seq.elements):
        return None
    return [e.value for e in seq.elements]


def _rotate_half_arg(ref: Ref, env: Env, used: set):
    """x for torch.cat((-x2, x1), dim=-1) (inline) or a call to a module function returning that."""
    scope = ref.scope
    trial = set()
    r = scope.follow(ref, trial)
    n = strip_parens(r.node)
    if not isinstance(n, cst.Call):
        return None
    parts = _cat_parts(n)
    if parts is not None:
        a, sa = _signed(r.with_node(parts[0]), trial)
        b, sb = _signed(r.with_node(parts[1]), trial)
        ha, hb = half_of(a, trial), half_of(b, trial)
        if ha and hb and ha[1] == 1 and hb[1] == 0 and sa == -1 and sb == 1 and scope.same(ha[0], hb[0]):
            used |= trial
            return ha[0]
        return None
    if isinstance(n.func, cst.Name) and len(n.args) == 1 and n.args[0].keyword is None:
        for fi in iter_functions(env.module):
            if fi.qualname == n.func.value and len(function_params(fi.node)) == 1:
                body = fi.node.body.body if isinstance(fi.node.body, cst.IndentedBlock) else []
                from ...pysource.scope import Scope
                sc = Scope(body, params=function_params(fi.node))
                for i, s in enumerate(body):
                    if m.matches(s, m.SimpleStatementLine(body=[m.Return()])) and s.body[0].value is not None:
                        x = _rotate_half_arg(Ref(s.body[0].value, sc, i), env, set())
                        if x is not None and m.matches(strip_parens(sc.follow(x).node), m.Name(function_params(fi.node)[0])):
                            return r.with_node(n.args[0].value)
    return None


def _signed_code(c: cst.BaseExpression, sign: int) -> str:
    inner = code(parens(c))
    return inner if sign > 0 else f"-{inner}"


class RotaryRecipe(ExprRecipe):
    def match(self, node, env: Env):
        if isinstance(node, cst.Call):
            return self._match_cat(node, env)
        if isinstance(node, cst.BinaryOperation) and env.target == "npu":
            return self._match_rotate_half(node, env)
        return None

    def _emit_x(self, x_ref: Ref, env: Env, here: Ref):
        x = env.scope.emit(x_ref, here)
        if x is None:
            return None, []
        if isinstance(strip_parens(x), (cst.Name, cst.Attribute)):
            return x, []
        if _has_effects(x):
            return None, []
        return cst.Name("_tb_rot_x"), [cst.parse_statement(f"_tb_rot_x = {code(x)}\n")]

    def _match_cat(self, node: cst.Call, env: Env):
        parts = _cat_parts(node)
        if parts is None:
            return None
        here = env.ref(node)
        used: set = set()
        y1 = linear_pair(here.with_node(parts[0]), used)
        y2 = linear_pair(here.with_node(parts[1]), used)
        if y1 is None or y2 is None or not env.scope.same(y1[0], y2[0]):
            return None
        x_ref = y1[0]
        (a1, sa1), (b1, sb1) = y1[1][0], y1[1][1]
        (a2, sa2), (b2, sb2) = y2[1][0], y2[1][1]
        x, pre = self._emit_x(x_ref, env, here)
        if x is None:
            return None
        e = lambda r: env.scope.emit(r, here)  # noqa: E731
        if any(e(c) is None for c in (a1, b1, a2, b2)):
            return None
        xs = code(x)
        if env.target == "npu":
            r1 = f"torch.cat([{_signed_code(e(a1), sa1)}, {_signed_code(e(b2), sb2)}], dim=-1).to({xs}.dtype)"
            r2 = f"torch.cat([{_signed_code(e(b1), -sb1)}, {_signed_code(e(a2), sa2)}], dim=-1).to({xs}.dtype)"
            new = expr(f"torch_npu.npu_rotary_mul({xs}, {r1}, {r2})")
            imports = ["import torch_npu"]
            notes = ["npu_rotary_mul needs a 4-D input (BNSD/BSND/SBND), D even and < 896; the cos/sin tables are "
                     "concatenated per call and cast to x's dtype (the eager form promoted to the tables' fp32 and "
                     "cast back): precomputing full-width tables once in the rotary module would save the two cats"]
        else:
            s1 = f"torch.cat([{_signed_code(e(a1), sa1)}, {_signed_code(e(b2), sb2)}], dim=-1)"
            s2 = f"torch.cat([{_signed_code(e(b1), sb1)}, {_signed_code(e(a2), sa2)}], dim=-1)"
            new = expr(f"{xs} * {s1} + {xs}.roll({xs}.size(-1) // 2, -1) * {s2}")
            imports, notes = [], ["the tables are concatenated per call (small: no batch/head dims); the output is "
                                  "bit-identical to the hand-written form"]
        return Match(node=node, new=parens(new), used=used, imports=imports, pre=pre, notes=notes,
                     detail={"x": xs, "form": "half-split concat",
                             "coefficients": f"y1 = x1*({_signed_code(e(a1), sa1)}) + x2*({_signed_code(e(b1), sb1)}); "
                                             f"y2 = x1*({_signed_code(e(a2), sa2)}) + x2*({_signed_code(e(b2), sb2)})"})

    def _match_rotate_half(self, node: cst.BinaryOperation, env: Env):
        if not isinstance(node.operator, cst.Add):
            return None
        here = env.ref(node)
        used: set = set()
        for p, q in ((node.left, node.right), (node.right, node.left)):
            pp, qq = strip_parens(p), strip_parens(q)
            if not (isinstance(pp, cst.BinaryOperation) and isinstance(pp.operator, cst.Multiply)
                    and isinstance(qq, cst.BinaryOperation) and isinstance(qq.operator, cst.Multiply)):
                continue
            for qa, qb in ((qq.left, qq.right), (qq.right, qq.left)):
                x_ref = _rotate_half_arg(here.with_node(qa), env, used)
                if x_ref is None:
                    continue
                for pa, pb in ((pp.left, pp.right), (pp.right, pp.left)):
                    if env.scope.same(here.with_node(pa), x_ref):
                        x, pre = self._emit_x(here.with_node(pa), env, here)
                        if x is None:
                            return None
                        xs = code(x)
                        cos, sin = code(parens(pb)), code(parens(qb))
                        new = expr(f"torch_npu.npu_rotary_mul({xs}, {cos}.to({xs}.dtype), {sin}.to({xs}.dtype))")
                        return Match(node=node, new=parens(new), used=used, imports=["import torch_npu"], pre=pre,
                                     notes=["npu_rotary_mul needs a 4-D input and full-width (D) cos/sin tables "
                                            "broadcastable to it; tables cast to x's dtype"],
                                     detail={"x": xs, "form": "x*cos + rotate_half(x)*sin"})
        return None

    def _no_site_reason(self, files, target):
        return ("rotary_fused: no half-split rotary embedding found (cat([x1*a1 + x2*b1, x1*a2 + x2*b2], -1) over the "
                "two halves of one tensor's last dimension" + (", or x*cos + rotate_half(x)*sin" if target == "npu" else "")
                + ")")
