"""sdpa_attention (L2): hand-written causal softmax attention as one fused operator.

Recognised (after following local names, so chained or split statements both match):

    P @ V   (or torch.matmul(P, V))   where
    P = softmax(S_masked, dim=-1)     (F.softmax / torch.softmax / S.softmax; an fp32 upcast
                                       inside and a cast back outside are accepted)
    S_masked = S.masked_fill(M, -inf) (M True = masked: causal when M is triu(ones, 1), or
                                       tril(ones) == 0 / ~tril / tril.logical_not(); the mask may
                                       be a registered buffer sliced [:T, :T] or [:, :, :T, :T])
             | S + A                  (A = triu(full(-inf), 1): an additive causal mask; any other
                                       additive or bool mask is passed explicitly as attn_mask)
             | `if M is not None: S = S + M` (an optional additive mask: attn_mask=M, None or not)
             | S                      (no mask: full, non-causal attention, as in a ViT)
    S = (Q @ K^T) * s | (Q @ K^T) / d | s * (Q @ K^T) | Q @ K^T
                                      (K^T: K.transpose(-2, -1), K.transpose(-1, -2), K.mT;
                                       K.transpose(2, 3) of 4-D B,H,T,D tensors)

Not applicable (with the reason) when dropout sits between softmax and `@ V`, or when the
attention weights are used elsewhere (returned for visualisation, say): the fused operator
never materialises them. Masks that are not provably causal keep their full form (no causal
block skipping).

cpu / cuda: `F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=s)` (the program's
scale is passed: SDPA's default is 1/sqrt(head_dim), which may differ).
npu: `torch_npu.npu_fusion_attention(q, k, v, q.size(1), "BNSD", atten_mask=<2048x2048 bool,
True above the diagonal>, scale=s, sparse_mode=2)[0]` (leftUpCausal with the compressed mask,
so the kernel skips fully masked blocks; scale passed since its default is 1).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ...pysource.names import assigned_names
from ...pysource.scope import Ref, _has_effects
from ...pysource.shapes import (
    call_name,
    dim_is_last,
    is_module_call,
    kwarg,
    method_receiver,
    num,
    positional,
    strip_parens,
)
from ...pysource.sites import positions, self_attribute_value, iter_functions, iter_statements
from ...pysource.syntax import code, expr, parens, walk
from .expr_engine import Env, ExprRecipe, Match

NPU_MASK_HELPER = '''
_TB_NPU_CAUSAL_MASK = {}


def _tb_npu_causal_mask(device):
    """The compressed causal mask npu_fusion_attention's sparse_mode=2 expects (2048x2048, True = masked)."""
    mask = _TB_NPU_CAUSAL_MASK.get(device)
    if mask is None:
        mask = _TB_NPU_CAUSAL_MASK[device] = torch.triu(
            torch.ones(2048, 2048, dtype=torch.bool, device=device), diagonal=1)
    return mask
'''


NPU_FULL_MASK_HELPER = '''
def _tb_npu_atten_mask(mask, sq, skv):
    """A bool mask (True = masked) broadcast to the [..., Sq, Skv] shape npu_fusion_attention accepts."""
    while mask.dim() < 2:
        mask = mask.unsqueeze(0)
    return mask.expand(*mask.shape[:-2], sq, skv).contiguous()
'''


class Miss(Exception):
    """A near miss: the shape is attention, but something makes the rewrite wrong."""


def _matmul(node):
    n = strip_parens(node)
    if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.MatrixMultiply):
        return n.left, n.right
    if isinstance(n, cst.Call) and is_module_call(n, {"matmul"}) and len(positional(n)) == 2:
        a, b = positional(n)
        return a, b
    return None


def _transposed(ref: Ref, used: set) -> Ref | None:
    r = ref.scope.follow(ref, used)
    n = strip_parens(r.node)
    if isinstance(n, cst.Attribute) and n.attr.value == "mT":
        return r.with_node(n.value)
    if isinstance(n, cst.Call) and call_name(n) == "transpose" and method_receiver(n, {"transpose"}) is not None \
            and len(n.args) == 2:
        dims = sorted(num(a.value) for a in n.args if num(a.value) is not None)
        # the last two dims: (-2, -1), or (2, 3) of the 4-D (B, H, T, D) layout the other
        # operand shares (a 3-D K would fail the matmul, and the loss check catches the rest)
        if dims in ([-2, -1], [2, 3]):
            return r.with_node(n.func.value)
    return None


def _strip_casts(ref: Ref, used: set) -> tuple[Ref, bool]:
    """Through .float() / .to(dtype) / .type_as(t) (returns whether one was seen)."""
    seen = False
    for _ in range(4):
        r = ref.scope.follow(ref, used)
        n = strip_parens(r.node)
        if isinstance(n, cst.Call) and method_receiver(n, {"float", "to", "type_as", "bfloat16", "half"}) is not None:
            name = call_name(n)
            if name in ("float", "bfloat16", "half") and not n.args or name == "type_as" and len(n.args) == 1 or \
                    name == "to" and len(n.args) == 1 and n.args[0].keyword is None and \
                    ("dtype" in code(n.args[0].value) or "float" in code(n.args[0].value) or "bfloat16" in code(n.args[0].value)):
                ref, seen = r.with_node(n.func.value), True
                continue
        return r, seen
    return ref, seen


def _neg_inf(node) -> bool:
    n = strip_parens(node)
    text = code(n).replace(" ", "")
    if text in ('float("-inf")', "float('-inf')", '-float("inf")', "-float('inf')", "-math.inf", "-torch.inf",
                "float('-Inf')", 'float("-Inf")', "-np.inf", "-numpy.inf"):
        return True
    if "finfo(" in text and (text.endswith(".min") or text.startswith("-") and text.endswith(".max")):
        return True
    v = num(n)
    return v is not None and v <= -1e4


def _drop_slices(ref: Ref, used: set) -> tuple[Ref, list]:
    """X for X[:T, :T] / X[:, :, :T, :T] / X[None, None] (returns the trailing square bounds)."""
    r = ref.scope.follow(ref, used)
    n = strip_parens(r.node)
    bounds: list = []
    while isinstance(n, cst.Subscript):
        parts = [e.slice for e in n.slice]
        ok = True
        for p in parts:
            if isinstance(p, cst.Slice):
                if p.lower is not None and num(p.lower) != 0 or p.step is not None:
                    ok = False
                if p.upper is not None:
                    bounds.append(p.upper)
            elif isinstance(p, cst.Index) and m.matches(p.value, m.Name("None")):
                continue
            else:
                ok = False
        if not ok:
            raise Miss(f"the mask is indexed in a way that is not a top-left [:T, :T] slice: {code(n)}")
        r = r.scope.follow(r.with_node(n.value), used)
        n = strip_parens(r.node)
    return r, bounds


def _through_views(ref: Ref, used: set) -> Ref:
    """Through .view(1, 1, n, n) / .unsqueeze(i) / [None, None] / .bool() / .to(torch.bool)."""
    for _ in range(6):
        r = ref.scope.follow(ref, used)
        n = strip_parens(r.node)
        if isinstance(n, cst.Call) and method_receiver(n, {"view", "reshape", "unsqueeze", "bool", "to", "expand"}):
            ref = r.with_node(n.func.value)
            continue
        return r
    return ref


def _square_ones(ref: Ref, used: set) -> bool:
    r = _through_views(ref, used)
    n = strip_parens(r.node)
    if not isinstance(n, cst.Call):
        return False
    name = call_name(n)
    if name in ("ones_like",):
        return True
    if name in ("ones", "full"):
        pos = positional(n)
        dims = pos
        if pos and isinstance(strip_parens(pos[0]), (cst.Tuple, cst.List)):
            dims = [e.value for e in strip_parens(pos[0]).elements]
        elif name == "full":
            return False
        if name == "full":
            fill = pos[1] if len(pos) > 1 else kwarg(n, "fill_value")
            if not m.matches(fill, m.Name("True")) and num(fill) != 1:
                return False
        if len(dims) == 2:
            return r.scope.same(r.with_node(dims[0]), r.with_node(dims[1]))
    return False


def _tri(ref: Ref, used: set, which: str) -> Ref | None:
    """The argument of torch.triu/tril(X, diagonal=k) or X.triu/tril(k); returns (arg, k)."""
    r = _through_views(ref, used)
    n = strip_parens(r.node)
    if not (isinstance(n, cst.Call) and call_name(n) == which):
        return None
    recv = method_receiver(n, {which})
    pos = positional(n)
    if recv is not None:
        a, rest = recv, pos
    elif pos:
        a, rest = pos[0], pos[1:]
    else:
        return None
    k = kwarg(n, "diagonal") if kwarg(n, "diagonal") is not None else (rest[0] if rest else cst.Integer("0"))
    return r.with_node(a), num(k)


def causal_bool_mask(ref: Ref, env: Env, used: set) -> str:
    """Raise Miss unless ref is a True-means-masked causal mask; return how it was recognised."""
    r, bounds = _drop_slices(ref, used)
    if len(bounds) == 2 and not r.scope.same(ref.with_node(bounds[0]), ref.with_node(bounds[1])):
        raise Miss("the mask slice is not square ([:Tq, :Tk] with different bounds)")
    r = _resolve_self(r, env)
    n = strip_parens(_through_views(r, used).node)
    # triu(ones, 1): True above the diagonal
    t = _tri(r, used, "triu")
    if t is not None:
        arg, k = t
        if k == 1 and _square_ones(arg, used):
            return "triu(ones, diagonal=1)"
        raise Miss(f"triu mask with diagonal {k} or a non-square/non-ones argument: not the causal mask")
    # tril(ones) == 0, ~tril(ones), tril(ones).logical_not()
    inner = None
    if isinstance(n, cst.Comparison) and len(n.comparisons) == 1 and isinstance(n.comparisons[0].operator, cst.Equal) \
            and (num(n.comparisons[0].comparator) == 0 or m.matches(n.comparisons[0].comparator, m.Name("False"))):
        inner = n.left
    elif isinstance(n, cst.UnaryOperation) and isinstance(n.operator, cst.BitInvert):
        inner = n.expression
    elif isinstance(n, cst.Call) and call_name(n) in ("logical_not", "eq") and method_receiver(n, {"logical_not", "eq"}) is not None:
        if call_name(n) == "logical_not" or (n.args and num(n.args[0].value) == 0):
            inner = n.func.value
    if inner is not None:
        rr, b2 = _drop_slices(r.with_node(inner), used)
        rr = _resolve_self(rr, env)
        t = _tri(rr, used, "tril")
        if t is not None and t[1] == 0 and _square_ones(t[0], used):
            return "tril(ones) == 0"
    raise Miss(f"the mask {code(ref.node)} is not provably causal (padding, window or other masks keep the eager path)")


def _resolve_self(r: Ref, env: Env) -> Ref:
    n = strip_parens(r.node)
    if m.matches(n, m.Attribute(value=m.Name("self"))):
        val = self_attribute_value(env.site.class_def, n.attr.value)
        if val is not None:
            return val.scope.follow(val)
    return r


def causal_additive_mask(ref: Ref, env: Env, used: set) -> str:
    r, bounds = _drop_slices(ref, used)
    r = _resolve_self(r, env)
    t = _tri(r, used, "triu")
    if t is not None and t[1] == 1:
        a = _through_views(t[0], used)
        n = strip_parens(a.node)
        if isinstance(n, cst.Call) and call_name(n) == "full":
            pos = positional(n)
            fill = pos[1] if len(pos) > 1 else kwarg(n, "fill_value")
            if fill is not None and _neg_inf(fill):
                return "triu(full(-inf), diagonal=1) added"
    raise Miss(f"the additive mask {code(ref.node)} is not provably causal")


def _optional_additive_mask(ref: Ref, used: set):
    """`if M is not None: S = S + M` (or `S += M`, no else) right before `S = S.softmax(-1)`.

    `ref` is the softmax's argument: a name whose last binding is that `if`. Returns
    (S as read before the `if`, M, the `if` statement), or None. Only when the softmax
    statement directly follows and rebinds the same name, so nothing else can read the
    masked scores the `if` produced (the rewrite drops the `if`).
    """
    n = strip_parens(ref.node)
    if not isinstance(n, cst.Name):
        return None
    hit = ref.scope.lookup(n.value, ref.at)
    if hit is None or hit[0].value is not None or hit[1] is not ref.scope or hit[0].index != ref.at - 1:
        return None
    after = ref.scope.stmts[ref.at]
    if n.value not in assigned_names(after):
        return None
    stmt_ = ref.scope.stmts[hit[0].index]
    if not isinstance(stmt_, cst.If) or stmt_.orelse is not None:
        return None
    test = strip_parens(stmt_.test)
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.IsNot)
            and m.matches(test.comparisons[0].comparator, m.Name("None")) and isinstance(test.left, cst.Name)):
        return None
    mask = test.left.value
    body = stmt_.body.body  # a one-line `if m: s = s + m` holds small statements: no match
    if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine) or len(body[0].body) != 1:
        return None
    small = body[0].body[0]
    names = {n.value, mask}
    if isinstance(small, cst.AugAssign):
        ok = isinstance(small.operator, cst.AddAssign) and m.matches(small.target, m.Name(n.value)) \
            and m.matches(small.value, m.Name(mask))
    elif isinstance(small, cst.Assign) and len(small.targets) == 1 and m.matches(small.targets[0].target, m.Name(n.value)):
        v = strip_parens(small.value)
        ok = isinstance(v, cst.BinaryOperation) and isinstance(v.operator, cst.Add) and \
            {getattr(strip_parens(v.left), "value", None), getattr(strip_parens(v.right), "value", None)} == names
    else:
        ok = False
    if not ok:
        return None
    at_if = Ref(cst.Name(n.value), ref.scope, hit[0].index)
    return at_if, Ref(cst.Name(mask), ref.scope, hit[0].index), stmt_


def _softmax_arg(ref: Ref, used: set) -> Ref | None:
    r = ref.scope.follow(ref, used)
    n = strip_parens(r.node)
    if not (isinstance(n, cst.Call) and call_name(n) == "softmax"):
        return None
    recv = method_receiver(n, {"softmax"})
    pos = positional(n)
    if recv is not None:
        a, rest = recv, pos
    elif pos:
        a, rest = pos[0], pos[1:]
    else:
        return None
    dim = kwarg(n, "dim") if kwarg(n, "dim") is not None else (rest[0] if rest else None)
    if dim is None or not dim_is_last(dim) or kwarg(n, "dtype") is not None:
        return None
    return r.with_node(a)


def _is_dropout(ref: Ref, used: set) -> bool:
    r = ref.scope.follow(ref, used)
    n = strip_parens(r.node)
    return isinstance(n, cst.Call) and ("dropout" in (call_name(n) or "").lower() or "drop" in code(n.func).lower())


def _scores(ref: Ref, used: set):
    """(q, k, scale_expr_text) for (q @ k^T) [* s | / d] (either order)."""
    r = ref.scope.follow(ref, used)
    n = strip_parens(r.node)
    mm = _matmul(n)
    if mm is not None:
        kt = _transposed(r.with_node(mm[1]), used)
        if kt is not None:
            return r.with_node(mm[0]), kt, "1.0"
        return None
    if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, (cst.Multiply, cst.Divide)):
        cands = [(n.left, n.right)] + ([(n.right, n.left)] if isinstance(n.operator, cst.Multiply) else [])
        for a, s in cands:
            trial = set()
            ra = r.scope.follow(r.with_node(a), trial)
            mm = _matmul(ra.node)
            if mm is None:
                continue
            kt = _transposed(ra.with_node(mm[1]), trial)
            if kt is None:
                continue
            used |= trial
            st = code(parens(s))
            return ra.with_node(mm[0]), kt, (st if isinstance(n.operator, cst.Multiply) else f"1.0 / {st}"), r.with_node(s)
    return None


class AttentionRecipe(ExprRecipe):
    def match(self, node, env: Env):
        try:
            return self._match(node, env)
        except Miss:
            return None

    def explain(self, files: dict[str, str], target: str) -> list[str]:
        """Near misses: attention-shaped code this recipe refuses, and why."""
        out = []
        for rel, text in sorted(files.items()):
            if not rel.endswith(".py"):
                continue
            try:
                pos = positions(text)
            except Exception:
                continue
            from ...pysource.imports import functional_alias
            for fi in iter_functions(pos.module):
                for ss in iter_statements(fi.node, fi.qualname, fi.class_def):
                    env = Env(ss, target, functional_alias(pos.module), pos.module, rel)
                    for sub in walk(ss.stmt) if isinstance(ss.stmt, cst.SimpleStatementLine) else []:
                        if _matmul(sub) is None:
                            continue
                        try:
                            self._match(sub, env)
                        except Miss as e:
                            out.append(f"{rel}:{pos.line(sub)} {fi.qualname}: {e}")
        return out

    def _match(self, node, env: Env):
        mm = _matmul(node)
        if mm is None:
            return None
        here = env.ref(node)
        scope = env.scope
        used: set = set()
        p_ref, v_node = here.with_node(mm[0]), mm[1]
        if _is_dropout(p_ref, set()):
            inner = scope.follow(p_ref)
            if any(_softmax_arg(inner.with_node(a.value), set()) for a in getattr(strip_parens(inner.node), "args", [])):
                raise Miss("dropout between softmax and @ v: the fused call would change the random stream")
            return None
        p_ref, cast_out = _strip_casts(p_ref, used)
        s_ref = _softmax_arg(p_ref, used)
        if s_ref is None:
            return None
        s_ref, cast_in = _strip_casts(s_ref, used)
        r = scope.follow(s_ref, used)
        n = strip_parens(r.node)
        mask_kind = None
        scored = None
        explicit = None
        drop: list = []
        if isinstance(n, cst.Call) and call_name(n) == "masked_fill":
            recv = method_receiver(n, {"masked_fill"})
            pos = positional(n)
            if recv is not None and len(pos) == 2:
                sc, mask, fill = recv, pos[0], pos[1]
            elif recv is None and len(pos) == 3:
                sc, mask, fill = pos
            else:
                return None
            scored = _scores(r.with_node(sc), used)
            if scored is None:
                return None
            if not _neg_inf(fill):
                raise Miss(f"masked_fill with {code(fill)}: not -inf, so masked positions keep weight")
            try:
                mask_kind = causal_bool_mask(r.with_node(mask), env, used)
            except Miss:
                explicit = ("bool", scope.emit(r.with_node(mask), here))
        elif isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Add):
            for a, b in ((n.left, n.right), (n.right, n.left)):
                trial = set()
                scored = _scores(r.with_node(a), trial)
                if scored is not None:
                    used |= trial
                    try:
                        mask_kind = causal_additive_mask(r.with_node(b), env, used)
                    except Miss:
                        explicit = ("additive", scope.emit(r.with_node(b), here))
                    break
            if scored is None:
                return None
        elif (optional := _optional_additive_mask(r, used)) is not None:
            before_if, mask_ref, if_stmt = optional
            scored = _scores(before_if, used)
            if scored is None:
                return None
            explicit = ("optional additive", scope.emit(mask_ref, here))
            drop = [if_stmt]
        else:
            scored = _scores(r, used)
            if scored is None:
                return None
            mask_kind = "none (full attention)"
        q_ref, k_ref, scale = scored[0], scored[1], scored[2]
        if len(scored) > 3:
            s_expr = scope.emit(scored[3], here)
            if s_expr is None:
                return None
            st = code(parens(s_expr))
            scale = st if not scale.startswith("1.0 / ") else f"1.0 / {st}"
        q, k = scope.emit(q_ref, here), scope.emit(k_ref, here)
        v = v_node
        if q is None or k is None or (explicit is not None and explicit[1] is None):
            return None
        for t in (q, k, v):
            if _has_effects(t) and not isinstance(strip_parens(t), (cst.Name, cst.Attribute)):
                return None
        qs, ks, vs = code(q), code(k), code(v)
        notes = []
        if explicit is not None and env.target == "npu" and explicit[0] != "bool":
            raise Miss(f"an {explicit[0]} mask: npu_fusion_attention takes bool masks only (True = masked)")
        if explicit is not None:
            return self._explicit(node, env, used, qs, ks, vs, scale, explicit, cast_in or cast_out, drop)
        causal = mask_kind != "none (full attention)"
        if cast_in or cast_out:
            notes.append("the eager softmax ran in fp32 between casts; the fused kernel accumulates in fp32 itself")
        if env.target == "npu" and causal:
            new = expr(f'torch_npu.npu_fusion_attention({qs}, {ks}, {vs}, {qs}.size(1), "BNSD", '
                       f"atten_mask=_tb_npu_causal_mask({qs}.device), scale={scale}, sparse_mode=2)[0]")
            imports, helpers = ["import torch_npu"], [("_tb_npu_causal_mask", NPU_MASK_HELPER)]
            notes.append("npu_fusion_attention: q/k/v must be 4-D (B, N, S, D) here (BNSD layout), D <= 768; "
                         "sparse_mode=2 (leftUpCausal) with the compressed 2048x2048 mask; numerics differ from "
                         "eager softmax within the dtype's precision")
        elif env.target == "npu":
            new = expr(f'torch_npu.npu_fusion_attention({qs}, {ks}, {vs}, {qs}.size(1), "BNSD", scale={scale})[0]')
            imports, helpers = ["import torch_npu"], []
            notes.append("npu_fusion_attention without a mask (full attention): q/k/v 4-D (B, N, S, D), D <= 768")
        elif causal:
            new = expr(f"{env.F}.scaled_dot_product_attention({qs}, {ks}, {vs}, is_causal=True, scale={scale})")
            imports, helpers = [], []
        else:
            new = expr(f"{env.F}.scaled_dot_product_attention({qs}, {ks}, {vs}, scale={scale})")
            imports, helpers = [], []
            notes.append("no mask: full (non-causal) attention, as the eager softmax computed it")
        return Match(node=node, new=parens(new) if getattr(node, "lpar", None) else new, used=used, imports=imports,
                     helpers=helpers, notes=notes,
                     detail={"q": qs, "k": ks, "v": vs, "scale": scale, "mask": mask_kind or ""})

    def _explicit(self, node, env, used, qs, ks, vs, scale, explicit, casts, drop=()):
        """A mask that is not provably causal, passed explicitly (same math, less work skipped).

        masked_fill(M, -inf) with a bool M (True = masked): SDPA's bool attn_mask means True =
        attend, so it gets ~M; npu_fusion_attention's atten_mask means True = masked, so it gets
        M with sparse_mode=0. An additive mask goes to SDPA as a float attn_mask; npu takes no
        additive mask here, so that case is left alone there. An optional additive mask
        (`if mask is not None: s = s + mask`) goes to SDPA as `attn_mask=mask`, which is None
        exactly when the eager code skipped the addition; the `if` is dropped (`drop`).
        """
        kind, mask = explicit
        ms = code(parens(mask))
        notes = ["the mask is not provably causal: it is passed explicitly (no causal block skipping); rows with "
                 "every position masked give NaN in both forms"]
        if kind == "optional additive":
            notes.append(f"the mask is optional: attn_mask={ms} is None exactly when the eager `if` added nothing")
        if casts:
            notes.append("the eager softmax ran in fp32 between casts; the fused kernel accumulates in fp32 itself")
        if env.target == "npu":
            if kind != "bool":
                return None  # npu_fusion_attention takes bool masks only (True = masked)
            full = f"_tb_npu_atten_mask({ms}, {qs}.size(-2), {ks}.size(-2))"
            new = expr(f'torch_npu.npu_fusion_attention({qs}, {ks}, {vs}, {qs}.size(1), "BNSD", atten_mask={full}, '
                       f"scale={scale}, sparse_mode=0)[0]")
            notes.append("npu_fusion_attention takes a mask shaped [B|1, N|1, Sq, Skv] (no broadcasting of the "
                         "query dim): the program's mask is expanded to it")
            return Match(node=node, new=new, used=used, imports=["import torch_npu"], notes=notes,
                         helpers=[("_tb_npu_atten_mask", NPU_FULL_MASK_HELPER)],
                         detail={"q": qs, "k": ks, "v": vs, "scale": scale, "mask": f"explicit {kind}: {ms}"})
        attn = f"~{ms}" if kind == "bool" else ms
        if kind == "bool" and isinstance(strip_parens(mask), cst.UnaryOperation) and \
                isinstance(strip_parens(mask).operator, cst.BitInvert):
            attn = code(parens(strip_parens(mask).expression))
        new = expr(f"{env.F}.scaled_dot_product_attention({qs}, {ks}, {vs}, attn_mask={attn}, scale={scale})")
        return Match(node=node, new=new, used=used, notes=notes, stmt_edits=[(s, None) for s in drop],
                     detail={"q": qs, "k": ks, "v": vs, "scale": scale, "mask": f"explicit {kind}: {ms}"})

    def _rewrite_file(self, rel, text, target, sites):
        out = super()._rewrite_file(rel, text, target, sites)
        new_text, done, notes = out
        if not done:
            return out
        # the attention weights must not survive: if an assignment of them is still read, the
        # fused call would add work instead of replacing it
        still = self._weights_still_used(new_text, done)
        if still:
            from .recipe_base import NotApplicable
            return NotApplicable(reason=f"sdpa_attention: the attention weights are also used elsewhere ({still}); "
                                        "the fused operator does not produce them")
        return out

    def _weights_still_used(self, new_text: str, done) -> str:
        mod = cst.parse_module(new_text)
        for fi in iter_functions(mod):
            if fi.qualname not in {s.qualname for s in done}:
                continue
            for s in walk(fi.node):
                if isinstance(s, cst.Call) and call_name(s) == "softmax":
                    return f"{fi.qualname}: {code(s)[:80]}"
        return ""

    def _no_site_reason(self, files, target):
        misses = self.explain(files, target)
        if misses:
            return "sdpa_attention: attention found but not rewritten: " + "; ".join(misses[:4])
        return "sdpa_attention: no hand-written softmax(q @ k^T) @ v attention found"
