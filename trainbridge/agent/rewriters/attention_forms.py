"""Recognisers for the eager attention forms the sdpa_attention recipe rewrites.

`recipes_attention.py` (the recipe, whose docstring lists the forms) asks these helpers
whether an expression is `softmax(mask(q @ k^T * s)) @ v` piece by piece: the matmuls and
the K transpose, casts around the softmax, the scale, and whether a mask is provably causal
(bool `triu(ones, 1)` / `tril(ones) == 0`, additive `triu(full(-inf), 1)`) or an optional
additive mask. They follow local names through `Ref` scopes and raise `Miss` for a near
miss (attention-shaped code the rewrite would get wrong), so the recipe can explain it.
Kept apart from the recipe because this is pure recognition over libcst trees: nothing here
builds a replacement or knows about targets.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ...pysource.names import assigned_names
from ...pysource.scope import Ref
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
from ...pysource.sites import self_attribute_value
from ...pysource.syntax import code, parens
from .expr_engine import Env


class Miss(Exception):
    """A near miss: the shape is attention, but something makes the rewrite wrong."""


def _einsum_spec(n) -> tuple[str, str, str, cst.BaseExpression, cst.BaseExpression] | None:
    """(left, right, out, a, b) for torch.einsum("left,right->out", a, b) with a literal spec."""
    if not (isinstance(n, cst.Call) and is_module_call(n, {"einsum"})):
        return None
    pos = positional(n)
    if len(pos) != 3 or len(n.args) != 3 or not isinstance(pos[0], cst.SimpleString):
        return None
    spec = pos[0].evaluated_value.replace(" ", "")
    if spec.count(",") != 1 or spec.count("->") != 1 or "." in spec:
        return None
    ins, out = spec.split("->")
    left, right = ins.split(",")
    return left, right, out, pos[1], pos[2]


def _einsum_product(n, transposed: bool):
    """(a, b) when torch.einsum computes a @ b (`transposed` False: "...ij,...jd->...id") or
    a @ b^T (True: "...id,...jd->...ij") over shared leading batch letters, else None."""
    spec = _einsum_spec(n)
    if spec is None:
        return None
    left, right, out, a, b = spec
    if not (len(left) == len(right) == len(out) >= 3 and len(set(left + right)) == len(left) + 1):
        return None
    batch = left[:-2]
    if right[:-2] != batch or out[:-2] != batch:
        return None
    i, x = left[-2:]
    if transposed:  # ...ix,...jx->...ij
        j = right[-2]
        ok = right[-1] == x and out[-2:] == i + j and len({i, j, x}) == 3
    else:  # ...ix,...xd->...id
        d = right[-1]
        ok = right[-2] == x and out[-2:] == i + d and len({i, d, x}) == 3
    return (a, b) if ok else None


def einsum_permuted(n, transposed: bool):
    """An einsum attention product whose operands are not in (batch..., T, D) order, e.g. heads
    third as in "bqhd,bkhd->bhqk" (Q @ K^T, `transposed`) and "bhqk,bkhd->bqhd" (P @ V): the
    permutations that put them in SDPA's order, else None.

    Q @ K^T: (q, k, perm_q, perm_k, None) when the output is (batch..., i, j) (the weights' layout
    the softmax and P @ V then see) and each operand holds the batch letters, its own row letter
    and the contracted one. P @ V: (p, v, None, (perm_v, perm_out)) when P's letters end in
    (query, key), the key is contracted with V, and V and the output hold the batch letters, so
    SDPA's output (P's batch..., query, d) is permuted into the einsum's output order."""
    spec = _einsum_spec(n)
    if spec is None:
        return None
    left, right, out, a, b = spec
    if not (len(left) == len(right) == len(out) >= 3) or any(len(set(s)) != len(s) for s in (left, right, out)):
        return None
    contracted = (set(left) & set(right)) - set(out)
    if len(contracted) != 1:
        return None
    x = contracted.pop()
    if transposed:
        i, j = out[-2], out[-1]
        batch = out[:-2]
        if not (set(left) == set(batch) | {i, x} and set(right) == set(batch) | {j, x} and i not in right
                and j not in left and len({i, j, x}) == 3):
            return None
        return a, b, [left.index(c) for c in batch + i + x], [right.index(c) for c in batch + j + x], None
    batch, i, j = left[:-2], left[-2], left[-1]
    if j != x:
        return None
    d = next((c for c in right if c not in left), None)
    if d is None or set(right) != set(batch) | {j, d} or set(out) != set(batch) | {i, d}:
        return None
    sdpa_out = batch + i + d
    return a, b, None, ([right.index(c) for c in batch + j + d], [sdpa_out.index(c) for c in out])


def permuted(text: str, perm: list[int] | None) -> str:
    """`text.permute(...)`, or text itself for no permutation or the identity."""
    return text if not perm or perm == sorted(perm) else f"{text}.permute({', '.join(map(str, perm))})"


def _matmul(node):
    """(a, b) for a @ b, torch.matmul(a, b), torch.bmm(a, b) (3-D, batch first) or an einsum
    that is a batched a @ b ("bhij,bhjd->bhid"), else None."""
    n = strip_parens(node)
    if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.MatrixMultiply):
        return n.left, n.right
    if isinstance(n, cst.Call) and is_module_call(n, {"matmul", "bmm"}) and len(positional(n)) == 2 and not n.args[
            0].keyword:
        a, b = positional(n)
        return a, b
    return _einsum_product(n, transposed=False)


def is_batched_3d(node) -> bool:
    """torch.bmm / torch.baddbmm, or a 3-letter einsum: operands are 3-D (batch x heads folded
    into one dim)."""
    n = strip_parens(node)
    if isinstance(n, cst.Call) and is_module_call(n, {"bmm", "baddbmm"}):
        return True
    spec = _einsum_spec(n)
    return spec is not None and len(spec[0]) == 3


def _baddbmm_scores(r: Ref, used: set):
    """(q, k, "1.0", alpha) for torch.baddbmm(E, q, k^T, beta=0, alpha=s): E is ignored at beta 0
    (torch's documented rule: nan and inf in it do not propagate), or adds nothing when it is
    torch.zeros(...). alpha (default 1) is the scale."""
    n = strip_parens(r.node)
    if not (isinstance(n, cst.Call) and is_module_call(n, {"baddbmm"})):
        return None
    pos = positional(n)
    if len(pos) != 3 or any(kw not in ("beta", "alpha") for kw in
                            (a.keyword.value for a in n.args if a.keyword is not None)):
        return None
    beta = kwarg(n, "beta")
    base = strip_parens(r.scope.follow(r.with_node(pos[0]), used).node)  # used up: beta=0 ignores it
    zeros = isinstance(base, cst.Call) and call_name(base) in ("zeros", "zeros_like")
    if not (beta is not None and num(beta) == 0 or zeros):
        raise Miss(f"baddbmm adds its first argument ({code(pos[0])}) at beta={code(beta) if beta else 1}: "
                   "not a pure scaled product")
    kt = _transposed(r.with_node(pos[2]), used, batched=True)
    if kt is None:
        return None
    alpha = kwarg(n, "alpha")
    return r.with_node(pos[1]), kt, "1.0", r.with_node(alpha if alpha is not None else cst.Float("1.0")), None


def _transposed(ref: Ref, used: set, batched: bool = False) -> Ref | None:
    r = ref.scope.follow(ref, used)
    n = strip_parens(r.node)
    if isinstance(n, cst.Attribute) and n.attr.value == "mT":
        return r.with_node(n.value)
    if isinstance(n, cst.Call) and call_name(n) == "transpose" and method_receiver(n, {"transpose"}) is not None \
            and len(n.args) == 2:
        dims = sorted(num(a.value) for a in n.args if num(a.value) is not None)
        # the last two dims: (-2, -1), or (2, 3) of the 4-D (B, H, T, D) layout the other
        # operand shares (a 3-D K would fail the matmul, and the loss check catches the rest),
        # or (1, 2) of bmm's 3-D operands
        if dims in ([-2, -1], [2, 3]) or batched and dims == [1, 2]:
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


def _bottom_aligned(p: cst.Slice) -> bool:
    """X[K - Q:K]: the last Q rows of a K-square mask (query and key lengths from one sequence
    make it the top-left slice; with a key cache they differ, and no training step has one)."""
    low = strip_parens(p.lower) if p.lower is not None else None
    return isinstance(low, cst.BinaryOperation) and isinstance(low.operator, cst.Subtract) and \
        p.upper is not None and code(strip_parens(low.left)) == code(strip_parens(p.upper))


def _drop_slices(ref: Ref, used: set, notes: list | None = None) -> tuple[Ref, list]:
    """X for X[:T, :T] / X[:, :, :T, :T] / X[None, None] (returns the trailing square bounds);
    X[:, :, K - Q:K, :K] too, noted in `notes` (`_bottom_aligned`; refused where there is no note to make)."""
    r = ref.scope.follow(ref, used)
    n = strip_parens(r.node)
    bounds: list = []
    while isinstance(n, cst.Subscript):
        parts = [e.slice for e in n.slice]
        ok = True
        for p in parts:
            if isinstance(p, cst.Slice):
                if p.step is None and _bottom_aligned(p) and notes is not None:  # said, never silently assumed
                    notes.append(f"the mask's rows {code(p.lower)}:{code(p.upper)} are its top-left rows when "
                                 "query and key lengths are equal (training, no key cache): is_causal assumes it")
                elif p.lower is not None and num(p.lower) != 0 or p.step is not None:
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


def causal_bool_mask(ref: Ref, env: Env, used: set, notes: list | None = None) -> str:
    """Raise Miss unless ref is a True-means-masked causal mask; return how it was recognised."""
    r, bounds = _drop_slices(ref, used, notes)
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
        rr, b2 = _drop_slices(r.with_node(inner), used, notes)
        rr = _resolve_self(rr, env)
        t = _tri(rr, used, "tril")
        if t is not None and t[1] == 0 and _square_ones(t[0], used):
            return "tril(ones) == 0"
    raise Miss(f"the mask {code(ref.node)} is not provably causal (padding, window or other masks keep the eager path)")


def causal_keep_mask(ref: Ref, env: Env, used: set, notes: list) -> str:
    """Raise Miss unless ref is a True-means-kept causal mask (tril(ones) as bool, the form
    `torch.where(mask, scores, min)` takes); return how it was recognised."""
    r, bounds = _drop_slices(ref, used, notes)
    if len(bounds) >= 2 and not r.scope.same(ref.with_node(bounds[-2]), ref.with_node(bounds[-1])) and \
            code(bounds[-2]) != code(bounds[-1]):
        raise Miss("the mask slice is not square ([:Tq, :Tk] with different bounds)")
    r = _resolve_self(r, env)
    t = _tri(r, used, "tril")
    if t is not None and t[1] == 0 and _square_ones(t[0], used):
        return "tril(ones) kept by torch.where"
    raise Miss(f"the kept-positions mask {code(ref.node)} is not provably causal")


def neg_fill(ref: Ref, used: set) -> bool:
    """-inf or the dtype's minimum, as a literal or through `torch.full([], value)` / a local name."""
    for _ in range(4):
        r = ref.scope.follow(ref, used)
        n = strip_parens(r.node)
        if _neg_inf(n):
            return True
        if isinstance(n, cst.Call) and call_name(n) in ("full", "tensor", "as_tensor"):
            pos = positional(n)
            fill = (pos[1] if len(pos) > 1 else kwarg(n, "fill_value")) if call_name(n) == "full" else \
                (pos[0] if pos else None)
            if fill is None:
                return False
            ref = r.with_node(fill)
            continue
        return False
    return False


def _resolve_self(r: Ref, env: Env) -> Ref:
    n = strip_parens(r.node)
    if m.matches(n, m.Attribute(value=m.Name("self"))):
        val = self_attribute_value(env.site.class_def, n.attr.value)
        if val is not None:
            return val.scope.follow(val)
    return r


def causal_additive_mask(ref: Ref, env: Env, used: set, notes: list | None = None) -> str:
    r, bounds = _drop_slices(ref, used, notes)
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


_FUNCTIONAL_DROPOUT = {"dropout"}  # F.dropout / nn.functional.dropout / torch.dropout (training is `train` there)


def attention_dropout(ref: Ref, env: Env, used: set, here: Ref) -> tuple[Ref, str, set] | None:
    """(the dropout's input, SDPA's `dropout_p` for it) when `ref` is dropout on the attention
    weights; None when it is no dropout; Miss when it is one whose probability cannot be said.

    `self.drop(P)` with `self.drop = nn.Dropout(...)` in __init__ becomes
    `self.drop.p if self.drop.training else 0.0` (the module's own flag, as nn.Dropout reads
    it); `F.dropout(P, p, training)` becomes `p if training else 0.0` (defaults 0.5, True).
    """
    before = set(used)
    r = env.scope.follow(ref, used)
    spent = used - before
    n = strip_parens(r.node)
    if not isinstance(n, cst.Call) or not _is_dropout(r, set()):
        return None

    def at_site(node) -> str:
        e = env.scope.emit(r.with_node(node), here)
        if e is None:
            raise Miss(f"the dropout's {code(node)[:40]} cannot be repeated at the attention call")
        return code(parens(e))

    pos = positional(n)
    name = call_name(n) or ""
    if name in _FUNCTIONAL_DROPOUT and isinstance(strip_parens(n.func), cst.Attribute):
        inp = pos[0] if pos else kwarg(n, "input")
        prob = pos[1] if len(pos) > 1 else kwarg(n, "p")
        train = pos[2] if len(pos) > 2 else (kwarg(n, "training") if kwarg(n, "training") is not None
                                             else kwarg(n, "train"))
        if inp is None or kwarg(n, "inplace") is not None or len(pos) > 3:
            raise Miss(f"dropout call {code(n)[:60]}: its arguments are not the usual (input, p, training)")
        if code(strip_parens(n.func)) == "torch.dropout" and train is None:
            raise Miss("torch.dropout without its train flag")
        p_text = at_site(prob) if prob is not None else "0.5"
        p_expr = p_text if train is None else f"({p_text} if {at_site(train)} else 0.0)"
        return r.with_node(inp), p_expr, spent
    func = strip_parens(n.func)
    if len(pos) != 1 or len(n.args) != 1:
        raise Miss(f"dropout call {code(n)[:60]}: not a one-argument dropout module call")
    if m.matches(func, m.Attribute(value=m.Name("self"))):
        val = self_attribute_value(env.site.class_def, func.attr.value)
        made = strip_parens(val.node) if val is not None else None
        if not (isinstance(made, cst.Call) and call_name(made) == "Dropout"):
            raise Miss(f"{code(func)} is not set to nn.Dropout(...) in __init__: its probability is not known here")
        mod = code(func)
        return r.with_node(pos[0]), f"({mod}.p if {mod}.training else 0.0)", spent
    raise Miss(f"dropout call {code(n)[:60]}: a module not set on self")


def _qk_product(ref: Ref, used: set) -> tuple[Ref, Ref, tuple | None] | None:
    """(q, k, permutations) for q @ k^T in any spelling (`_matmul` with a transposed K, or an
    einsum "...id,...jd->...ij" that needs no transpose; permutations (of q, of k) for an einsum
    over another layout, `einsum_permuted`)."""
    n = strip_parens(ref.node)
    if (pair := _einsum_product(n, transposed=True)) is not None:
        return ref.with_node(pair[0]), ref.with_node(pair[1]), None
    if (perm := einsum_permuted(n, transposed=True)) is not None:
        return ref.with_node(perm[0]), ref.with_node(perm[1]), (perm[2], perm[3])
    mm = _matmul(n)
    if mm is None:
        return None
    kt = _transposed(ref.with_node(mm[1]), used, batched=is_batched_3d(n))
    return None if kt is None else (ref.with_node(mm[0]), kt, None)


def _is_qk(n) -> bool:
    return _matmul(n) is not None or _einsum_product(n, transposed=True) is not None or \
        einsum_permuted(n, transposed=True) is not None


def _scores(ref: Ref, used: set):
    """(q, k, scale_expr_text, scale_ref or None, permutations or None) for (q @ k^T) [* s | / d]
    (either order), or torch.baddbmm(_, q, k^T, beta=0, alpha=s)."""
    r = ref.scope.follow(ref, used)
    n = strip_parens(r.node)
    if (scored := _baddbmm_scores(r, used)) is not None:
        return scored
    if _is_qk(n):
        qk = _qk_product(r, used)
        return None if qk is None else (qk[0], qk[1], "1.0", None, qk[2])
    if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, (cst.Multiply, cst.Divide)):
        cands = [(n.left, n.right)] + ([(n.right, n.left)] if isinstance(n.operator, cst.Multiply) else [])
        for a, s in cands:
            trial = set()
            ra = r.scope.follow(r.with_node(a), trial)
            qk = _qk_product(ra, trial)
            if qk is None:
                continue
            used |= trial
            st = code(parens(s))
            return (qk[0], qk[1], (st if isinstance(n.operator, cst.Multiply) else f"1.0 / {st}"), r.with_node(s),
                    qk[2])
    return None
