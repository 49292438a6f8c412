"""The inputs each catalog entry is checked at: the records' shapes, scaled down.

A builder takes a seed and returns a `Case`: the launcher's arguments (the records' dtypes,
widths 128-512, 2-6 heads, at most a few hundred rows: Triton's interpreter runs every program
of the grid in Python), the tensors the launcher writes in place, and for an autograd.Function
the gradient to run backward with. The check builds each case twice from the same seed, once
for the original and once for the replacement, so in-place writes and views (a launcher writing
into a slice of a buffer) are compared exactly as the program sees them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

BF16 = torch.bfloat16


@dataclass
class Case:
    args: tuple
    kwargs: dict = field(default_factory=dict)
    apply: bool = False
    watch: dict[str, torch.Tensor] = field(default_factory=dict)
    observe: Callable[[Any, "Case"], dict[str, torch.Tensor]] | None = None
    grad_output: Callable[[Any], Any] | None = None
    grad_of: dict[str, torch.Tensor] = field(default_factory=dict)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(g, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _normalized(g, *shape):
    x = torch.randn(*shape, generator=g)
    return (x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)).to(BF16)


# ---- symmetric products ----------------------------------------------------------------------

def xxt(seed: int, shape=(128, 192)) -> Case:
    g = _gen(seed)
    A = _normalized(g, *shape) * 4
    out = torch.empty((*shape[:-1], shape[-2]), dtype=BF16)
    return Case(args=(A,), kwargs={"out": out}, watch={"out": out})


def ba_plus_caa(seed: int, shape=(128, 128)) -> Case:
    g = _gen(seed)
    X = _normalized(g, *shape[:-1], 160).float()
    A = (X @ X.mT).to(BF16)
    out = torch.empty_like(A)
    return Case(args=(A,), kwargs={"alpha": 2.0315, "beta": -4.775, "out": out}, watch={"out": out})


def xtx(seed: int, shape=(256, 128)) -> Case:
    g = _gen(seed)
    A = _normalized(g, *shape) * 4
    out = torch.empty((*shape[:-2], shape[-1], shape[-1]), dtype=BF16)
    return Case(args=(A,), kwargs={"out": out}, watch={"out": out})


# ---- fused linear + relu^2 --------------------------------------------------------------------

def linear_relu_square(seed: int, rows=192, dim=128, hidden=512, backward=False) -> Case:
    g = _gen(seed)
    if not backward:
        a = _randn(g, rows, dim, dtype=BF16)
        b = _randn(g, hidden, dim, dtype=BF16, scale=dim ** -0.5)
        return Case(args=(a, b))
    grad = _randn(g, rows, dim, dtype=BF16, scale=0.1)
    w2 = _randn(g, hidden, dim, dtype=BF16, scale=dim ** -0.5)
    pre = _randn(g, rows, hidden, dtype=BF16)
    return Case(args=(grad, w2), kwargs={"aux": pre})


def linear_relu_square_post_only(seed: int, rows=192, dim=128, hidden=512, backward=False) -> Case:
    if not backward:
        return linear_relu_square(seed, rows, dim, hidden)
    g = _gen(seed)
    grad = _randn(g, rows, dim, dtype=BF16, scale=0.1)
    w2 = _randn(g, hidden, dim, dtype=BF16, scale=dim ** -0.5)
    post = _randn(g, rows, hidden, dtype=BF16).relu().square()  # the forward's output: >= 0, half zeros
    return Case(args=(grad, w2), kwargs={"aux": post})


def _fp8_operands(g, rows, dim, hidden):
    a = _randn(g, rows, dim, dtype=BF16)
    b = _randn(g, hidden, dim, dtype=BF16, scale=dim ** -0.5)
    sa = a.float().abs().max() / 448.0
    sb = b.float().abs().max() / 448.0
    a_f8 = (a.float() / sa).to(torch.float8_e4m3fn)
    b_f8 = (b.float() / sb).to(torch.float8_e4m3fn)
    return a, b, a_f8, b_f8, (sa * sb).reshape(1).float()


def linear_relu_square_fp8_up(seed: int, rows=192, dim=128, hidden=512) -> Case:
    g = _gen(seed)
    a, b, a_f8, b_f8, scale = _fp8_operands(g, rows, dim, hidden)
    return Case(args=(a, b), kwargs={"a_f8": a_f8, "b_f8": b_f8, "dequant_scale_ptr": scale})


def linear_relu_square_fp8_up_down(seed: int, rows=192, dim=128, hidden=512) -> Case:
    g = _gen(seed)
    a, b, a_f8, b_f8, scale = _fp8_operands(g, rows, dim, hidden)
    act_scale = torch.tensor([0.02], dtype=torch.float32)
    partial = torch.zeros(8, dtype=torch.float32)

    def observe(result, case):
        c, post, post_f8 = result
        return {"pre": c, "post": post, "post_fp8": post_f8, "partial_amax.max": case.watch["partial_amax"].max()}

    return Case(args=(a, b), kwargs={"a_f8": a_f8, "b_f8": b_f8, "dequant_scale_ptr": scale,
                                     "activation_scale": act_scale, "partial_amax": partial},
                watch={"partial_amax": partial}, observe=observe)


# ---- fp8 delayed scaling ----------------------------------------------------------------------

def reduce_mlp_activation_scales(seed: int, layers=5, partials=12) -> Case:
    g = _gen(seed)
    partial = torch.rand(layers, partials, generator=g) * 30
    buffer = torch.ones(layers + 2)
    return Case(args=(partial, buffer[:layers]), kwargs={"headroom": 1.8}, watch={"scales_buffer": buffer})


def quantize_transpose_mlp_down_weights(seed: int, layers=3, hidden=160, dim=96) -> Case:
    g = _gen(seed)
    bank = _randn(g, layers, 2, hidden, dim, scale=0.05)
    weights = bank[:, 1]
    out = torch.zeros(layers, dim, hidden, dtype=torch.float8_e4m3fn)
    next_scales = weights.abs().amax(dim=(1, 2)) / 448.0 * 1.1
    used = torch.zeros(layers)
    tiles = -(-hidden // 64) * -(-dim // 64)
    partial = torch.zeros(layers, tiles)
    return Case(args=(weights, out, next_scales, used, partial),
                watch={"output_storage": out, "next_scales": next_scales, "used_scales": used,
                       "partial_amax": partial})


# ---- transposed copies ------------------------------------------------------------------------

def transpose_copy(seed: int, shape=(100, 72), dtype="float32") -> Case:
    g = _gen(seed)
    src = _randn(g, *shape, scale=4.0).to(getattr(torch, dtype))
    dst = torch.zeros(shape[1], shape[0], dtype=src.dtype)
    return Case(args=(src, dst), watch={"dst": dst})


def transpose_add(seed: int, shape=(80, 48), dtype="float32") -> Case:
    g = _gen(seed)
    src = _randn(g, *shape).to(getattr(torch, dtype))
    dst = _randn(g, shape[1], shape[0]).to(getattr(torch, dtype))
    return Case(args=(src, dst), watch={"dst": dst})


# ---- softcapped cross-entropy -----------------------------------------------------------------

def _targets(g, rows, vocab, invalid=True):
    t = torch.randint(0, vocab, (rows,), generator=g)
    t[rows // 3] = t[rows // 3 + 1]  # a repeated target: two predictions hit one column
    if invalid:
        t[rows // 2] = -1
    return t


def softcapped_ce(seed: int, rows=64, vocab=300, weights=(1.0, 0.5, 0.25)) -> Case:
    g = _gen(seed)
    logits = _randn(g, rows, vocab, dtype=BF16, scale=3.0).requires_grad_(True)
    mtp = torch.tensor(weights, dtype=torch.float32) if weights is not None else None
    grad = torch.rand(rows, generator=g) + 0.5
    return Case(args=(logits, _targets(g, rows, vocab), mtp, 23.0, 5.0, 7.5), apply=True,
                grad_output=lambda out: grad, grad_of={"logits": logits})


def softcapped_ce_fp8(seed: int, rows=64, dim=128, vocab=320) -> Case:
    g = _gen(seed)
    x = _randn(g, rows, dim, dtype=BF16).requires_grad_(True)
    w = _randn(g, dim, vocab, dtype=BF16, scale=dim ** -0.5).requires_grad_(True)
    mtp = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float32)
    grad = torch.full((rows,), 1.0)
    return Case(args=(x, _targets(g, rows, vocab, invalid=False), mtp, w, 0.25, 0.01, 2.0 ** -6), apply=True,
                grad_output=lambda out: grad, grad_of={"x": x, "lm_head_weight": w})


def ce_fwd_bwd(seed: int, rows=48, vocab=512, n_predict=3) -> Case:
    g = _gen(seed)
    logits = _randn(g, rows, vocab, dtype=BF16, scale=3.0)
    targets = _targets(g, rows, vocab, invalid=False)
    targets[5:8] = targets[4]  # equal consecutive targets: every prediction hits one column
    mtp = torch.tensor([1.0, 0.5, 0.25][:n_predict], dtype=torch.float32)
    losses = torch.zeros(rows)
    grad_input = torch.zeros(rows, vocab, dtype=torch.float8_e5m2)
    return Case(args=(logits, targets, mtp, losses, grad_input, rows, n_predict, 23.0, 5.0, 7.5, 2.0 ** -8,
                      1.0 / rows), watch={"losses": losses, "grad_input": grad_input})


def ce_fwd_bwd_prefix(seed: int, rows=48, vocab=512, n_predict=3) -> Case:
    base = ce_fwd_bwd(seed, rows, vocab, n_predict)
    logits, targets, mtp, losses, grad_input = base.args[:5]
    g = _gen(seed + 1000)
    prefix = torch.randint(0, vocab, (rows,), generator=g)
    prefix[::5] = -1  # no valid prefix token
    prefix[1::7] = targets[1::7]  # the prefix token is the next token: one column, two weights
    prefix[2::9] = vocab + 3  # out of range: ignored like a negative one
    prefix_weight = torch.tensor([0.3], dtype=torch.float32)
    return Case(args=(logits, targets, mtp, prefix, prefix_weight, losses, grad_input, *base.args[5:]),
                watch=base.watch)


# ---- dynamically composable attention correction ----------------------------------------------

def _dc_inputs(g, T, H=6, D=128):
    q = _randn(g, 1, T, H, D, dtype=BF16)
    k = _randn(g, 1, T, H, D, dtype=BF16)
    v = _randn(g, 1, T, H, D, dtype=BF16)
    w1 = _randn(g, 1, T, H, dtype=BF16, scale=0.5)
    w2 = _randn(g, 1, T, H, dtype=BF16, scale=0.5)
    return q, k, v, w1, w2


def dc_doc_bounds(seed: int, T=200) -> Case:
    cu = torch.tensor([0, 37, 90, 150, T], dtype=torch.int32)
    return Case(args=(cu, T, 4, (4).bit_length()))


def dc_forward(seed: int, T=96, window=32, aux=True, base_4d=False) -> Case:
    g = _gen(seed)
    q, k, v, w1, w2 = _dc_inputs(g, T)
    cu = torch.tensor([0, 40, T], dtype=torch.int32)
    base = _randn(g, *((1, T, 6, 128) if base_4d else (T, 6, 128)), dtype=BF16)
    return Case(args=(q, k, v, w1, w2, cu, 0.12, window, 16), kwargs={"return_aux": aux, "base_out": base})


def _dense_dc_lse(q, k, cu, window, scaling):
    """Per-head log-sum-exp of the windowed, document-causal scores (dense, for the inputs)."""
    T = q.shape[1]
    t = torch.arange(T)
    doc = torch.bucketize(t, cu[1:].long(), right=True)
    rel = t[:, None] - t[None, :]
    mask = (rel >= 0) & (rel < window) & (doc[:, None] == doc[None, :])
    s = torch.einsum("thd,shd->hts", q[0].float(), k[0].float()) * scaling
    return torch.logsumexp(s.masked_fill(~mask, float("-inf")), dim=-1).T[None].contiguous(), doc, cu


def dc_backward(seed: int, T=96, window=32, skip_qk=False) -> Case:
    g = _gen(seed)
    q, k, v, w1, w2 = _dc_inputs(g, T)
    cu = torch.tensor([0, 40, T], dtype=torch.int32)
    lse, doc, _ = _dense_dc_lse(q, k, cu, window, 0.12)
    starts = cu[doc].to(torch.int32)
    ends = cu[doc + 1].to(torch.int32)
    grad = _randn(g, T, 6, 128, dtype=BF16, scale=0.1)
    return Case(args=(q, k, v, w1, w2, cu, starts, ends, lse, grad, 0.12, window, skip_qk))


BUILDERS: dict[str, Callable[..., Case]] = {
    name: fn for name, fn in globals().items()
    if callable(fn) and getattr(fn, "__module__", None) == __name__ and not name.startswith("_")
    and name not in ("Case",)
}
