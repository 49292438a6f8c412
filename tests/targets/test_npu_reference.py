"""Reference torch_npu operators vs the unfused eager math they replace (forward and backward).

Liger-Kernel style: small random shapes, a per-dtype (atol, rtol) table, gradients of every
differentiable input compared. The eager side runs in the test dtype, as the GPU program
would; the references compute in float32, so low-precision tolerances absorb the rounding
of the eager intermediates.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trainbridge import npu_reference as R
from trainbridge.npu_reference import NpuConstraintError

TOL = {  # dtype: (atol, rtol)
    torch.float32: (1e-5, 1e-5),
    torch.float16: (5e-3, 5e-3),
    torch.bfloat16: (4e-2, 4e-2),
}
GRAD_TOL = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (8e-2, 8e-2),
}
DTYPES = list(TOL)


def _rand(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _leaves(*ts):
    return [t.detach().clone().requires_grad_(True) for t in ts]


def _check(out, ref, dtype, grads=False):
    atol, rtol = (GRAD_TOL if grads else TOL)[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


def _fwd_bwd(fn_ref, fn_eager, inputs, dtype, seed=7):
    """Run both on fresh leaves with the same upstream gradient; compare outputs and grads."""
    a, b = _leaves(*inputs), _leaves(*inputs)
    out_r, out_e = fn_ref(*a), fn_eager(*b)
    _check(out_r, out_e, dtype)
    g = _rand(*out_e.shape, dtype=dtype, seed=seed)
    out_r.backward(g)
    out_e.backward(g)
    for x, y in zip(a, b):
        _check(x.grad, y.grad, dtype, grads=True)


# --- rms norm ------------------------------------------------------------------------------------

def _eager_rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_eager_forward_backward(dtype):
    x, w = _rand(3, 5, 64, dtype=dtype), _rand(64, dtype=dtype, seed=1) + 1
    _fwd_bwd(lambda x, w: R.npu_rms_norm(x, w, 1e-5)[0], lambda x, w: _eager_rms(x, w, 1e-5), (x, w), dtype)


def test_rms_norm_returns_y_and_float32_rstd():
    x, w = _rand(4, 2, 32), torch.ones(32)
    y, rstd = R.npu_rms_norm(x.bfloat16(), w.bfloat16())
    assert y.dtype == torch.bfloat16 and rstd.dtype == torch.float32 and rstd.shape == (4, 2, 1)
    torch.testing.assert_close(rstd, torch.rsqrt(x.bfloat16().float().pow(2).mean(-1, keepdim=True) + 1e-6))


def test_rms_norm_refuses_mixed_gamma_dtype():
    with pytest.raises(NpuConstraintError, match="gamma dtype"):
        R.npu_rms_norm(_rand(2, 8, dtype=torch.bfloat16), torch.ones(8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_forward(dtype):
    x1, x2, w = _rand(2, 3, 32, dtype=dtype), _rand(2, 3, 32, dtype=dtype, seed=1), _rand(32, dtype=dtype, seed=2)
    y, rstd, xs = R.npu_add_rms_norm(x1, x2, w, 1e-6)
    _check(xs, x1 + x2, dtype)
    _check(y, _eager_rms((x1.float() + x2.float()), w.float(), 1e-6), dtype)
    assert rstd.dtype == torch.float32 and rstd.shape == (2, 3, 1)


def test_add_rms_norm_refuses_backward():
    x1, x2, w = _leaves(_rand(2, 16), _rand(2, 16, seed=1), torch.ones(16))
    y = R.npu_add_rms_norm(x1, x2, w)[0]
    with pytest.raises(RuntimeError, match="no backward"):
        y.sum().backward()
    with torch.no_grad():  # inference use is fine
        assert R.npu_add_rms_norm(x1, x2, w)[0].shape == (2, 16)


# --- rotary --------------------------------------------------------------------------------------

def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _cos_sin(s, d, dtype):
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(s).float(), inv)          # (S, D/2)
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_half_equals_rotate_half_with_full_width_tables(dtype):
    b, n, s, d = 2, 3, 5, 16
    cos, sin = _cos_sin(s, d, dtype)
    cos = torch.cat((cos, cos), -1).view(1, 1, s, d)           # full width: D, not D/2
    sin = torch.cat((sin, sin), -1).view(1, 1, s, d)
    x = _rand(b, n, s, d, dtype=dtype)
    _fwd_bwd(lambda x, c, s_: R.npu_rotary_mul(x, c, s_), lambda x, c, s_: x * c + _rotate_half(x) * s_,
             (x, cos, sin), dtype)


def test_rotary_interleave_equals_complex_rotation():
    b, s, n, d = 2, 4, 3, 8                                    # BSND
    cos, sin = _cos_sin(s, d, torch.float32)
    x = _rand(b, s, n, d)
    xc = torch.view_as_complex(x.view(b, s, n, d // 2, 2))
    rot = torch.polar(torch.ones_like(cos), torch.atan2(sin, cos)).view(1, s, 1, d // 2)
    want = torch.view_as_real(xc * rot).flatten(-2)
    r1 = cos.repeat_interleave(2, -1).view(1, s, 1, d)
    r2 = sin.repeat_interleave(2, -1).view(1, s, 1, d)
    torch.testing.assert_close(R.npu_rotary_mul(x, r1, r2, rotary_mode="interleave"), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bad", ["3d", "odd", "half_width", "mode"])
def test_rotary_constraints(bad):
    x, c = _rand(1, 2, 4, 8), torch.ones(1, 1, 4, 8)
    args = {"3d": (x[0], c[0], c[0]), "odd": (x[..., :7], c[..., :7], c[..., :7]),
            "half_width": (x, c[..., :4], c[..., :4]), "mode": (x, c, c, "rope")}[bad]
    with pytest.raises(NpuConstraintError):
        R.npu_rotary_mul(*args)


# --- activations -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_matches_silu_gate(dtype):
    x = _rand(4, 6, 32, dtype=dtype)

    def eager(x):
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b
    _fwd_bwd(lambda x: R.npu_swiglu(x, dim=-1), eager, (x,), dtype)


def test_swiglu_other_dim_and_noncontiguous_refusal():
    x = _rand(6, 4)
    torch.testing.assert_close(R.npu_swiglu(x, dim=0), F.silu(x[:3]) * x[3:])
    with pytest.raises(NpuConstraintError, match="non-contiguous"):
        R.npu_swiglu(_rand(4, 6).t())


@pytest.mark.parametrize("dtype", DTYPES)
def test_geglu_default_activates_right_half(dtype):
    x = _rand(3, 16, dtype=dtype)

    def eager(x):
        a, b = x.chunk(2, dim=-1)
        return a * F.gelu(b, approximate="tanh")
    _fwd_bwd(lambda x: R.npu_geglu(x)[0], eager, (x,), dtype)


def test_geglu_activate_left_and_approximate_none():
    x = _rand(3, 16)
    a, b = x.chunk(2, dim=-1)
    out, g = R.npu_geglu(x, dim=-1, approximate=0, activate_left=True)
    torch.testing.assert_close(out, F.gelu(a) * b)
    torch.testing.assert_close(g, F.gelu(a))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_F_gelu(dtype, approximate):
    x = _rand(5, 33, dtype=dtype)
    _fwd_bwd(lambda x: R.npu_gelu(x, approximate=approximate), lambda x: F.gelu(x, approximate=approximate), (x,), dtype)


def test_fast_gelu_equals_both_documented_formulas():
    x = _rand(1000, scale=4.0)
    a = x.abs()
    training_series = x / (1 + torch.exp(-1.702 * a)) * torch.exp(0.851 * (x - a))
    a2_a3 = x / (1 + torch.exp(-1.702 * x))
    y = R.npu_fast_gelu(x)
    torch.testing.assert_close(y, training_series, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(y, a2_a3, atol=1e-6, rtol=1e-5)
    assert (y - F.gelu(x)).abs().max() < 0.03  # an approximation of GELU, not GELU


# --- softmax / layout / loss ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_scaled_masked_softmax_matches_eager(dtype):
    x = _rand(2, 2, 32, 64, dtype=dtype)
    mask = torch.rand(2, 1, 32, 64, generator=torch.Generator().manual_seed(3)) < 0.3
    mask[..., 0] = False  # no fully masked rows
    _fwd_bwd(lambda x: R.npu_scaled_masked_softmax(x, mask, 0.125),
             lambda x: torch.softmax((x.float() * 0.125).masked_fill(mask, float("-inf")), -1).to(dtype), (x,), dtype)


def test_scaled_masked_softmax_triu_and_constraints():
    x = _rand(1, 1, 32, 32)
    causal = torch.ones(32, 32, dtype=torch.bool).triu(1)
    torch.testing.assert_close(R.npu_scaled_masked_softmax(x, torch.zeros(1, 1, 32, 32, dtype=torch.bool), 1.0, True),
                               torch.softmax(x.masked_fill(causal, float("-inf")), -1))
    with pytest.raises(NpuConstraintError, match="multiple of 32"):
        R.npu_scaled_masked_softmax(_rand(1, 1, 16, 48), torch.zeros(1, 1, 16, 48, dtype=torch.bool))


def test_confusion_transpose_doc_examples():
    x = _rand(2, 3, 4, 6)
    y = R.npu_confusion_transpose(x, (0, 2, 1, 3), (2, 4, 18), True)
    assert y.shape == (2, 4, 18)
    torch.testing.assert_close(y, x.permute(0, 2, 1, 3).contiguous().reshape(2, 4, 18))
    y2 = R.npu_confusion_transpose(x, (0, 2, 1), (2, 12, 6), False)
    assert y2.shape == (2, 6, 12)
    torch.testing.assert_close(y2, x.reshape(2, 12, 6).permute(0, 2, 1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_matches_F_cross_entropy(dtype, reduction):
    logits = _rand(12, 10, dtype=dtype)
    target = torch.randint(0, 10, (12,), generator=torch.Generator().manual_seed(5))
    target[3] = -100
    w = torch.rand(10, generator=torch.Generator().manual_seed(6)) * 0.9 + 0.1
    a, b = _leaves(logits, logits)
    loss, log_prob, zloss, lse = R.npu_cross_entropy_loss(a, target, w, reduction, -100, 0.1)
    ref = F.cross_entropy(b.float(), target, weight=w, reduction=reduction, label_smoothing=0.1)
    assert loss.shape == ((12,) if reduction == "none" else (1,))  # documented [1], not a 0-d scalar
    assert zloss.numel() == 0 and lse.numel() == 0 and log_prob.shape == (12, 10)
    _check(loss.reshape(ref.shape), ref, dtype)
    loss.sum().backward()
    ref.sum().backward()
    _check(a.grad, b.grad, dtype, grads=True)


def test_cross_entropy_refuses_zloss_and_bad_target():
    x, t = _rand(4, 5), torch.zeros(4, dtype=torch.long)
    with pytest.raises(NotImplementedError):
        R.npu_cross_entropy_loss(x, t, return_zloss=True)
    with pytest.raises(NpuConstraintError, match="int64"):
        R.npu_cross_entropy_loss(x, t.int())


def test_format_cast_is_an_identity_copy():
    x = _rand(4, 4)
    y = R.npu_format_cast(x, 29)
    torch.testing.assert_close(y, x)
    assert y.data_ptr() != x.data_ptr() and R.get_npu_format(y) == 2


# --- attention ------------------------------------------------------------------------------------

def _bnsd(b=2, n=4, s=8, d=16, dtype=torch.float32, seed=0, skv=None):
    skv = skv or s
    return (_rand(b, n, s, d, dtype=dtype, seed=seed), _rand(b, n, skv, d, dtype=dtype, seed=seed + 1),
            _rand(b, n, skv, d, dtype=dtype, seed=seed + 2))


def _causal(sq, skv, bottom_right=False):
    off = skv - sq if bottom_right else 0
    return torch.ones(sq, skv, dtype=torch.bool).triu(1 + off)


COMPRESSED = torch.ones(2048, 2048, dtype=torch.bool).triu(1)


def test_fusion_attention_returns_seven_values_output_first():
    q, k, v = _bnsd()
    out = R.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.25)
    assert len(out) == 7 and out[0].shape == q.shape
    assert out[1].shape == (2, 4, 8, 8) and out[1].dtype == torch.float32 and out[3].numel() == 0
    assert all(isinstance(x, int) for x in out[4:])


def test_fusion_attention_scale_defaults_to_one():
    q, k, v = _bnsd()
    out = R.npu_fusion_attention(q, k, v, 4, "BNSD")[0]
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=1.0), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, F.scaled_dot_product_attention(q, k, v), atol=1e-3)  # SDPA's 1/sqrt(d)


def test_fusion_attention_mask_true_means_excluded():
    q, k, v = _bnsd()
    v = v.clone()
    v[:, :, 0] = 1e4                         # key 0 would dominate any output that attends to it
    mask = torch.zeros(8, 8, dtype=torch.bool)
    mask[:, 0] = True                        # True = masked out
    out = R.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=mask, scale=0.25)[0]
    want = F.scaled_dot_product_attention(q, k[:, :, 1:], v[:, :, 1:], scale=0.25)
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
    assert out.abs().max() < 100


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sparse_mode", [0, 2, 3])
def test_fusion_attention_causal_equals_sdpa_is_causal(dtype, sparse_mode):
    q, k, v = _bnsd(dtype=dtype)
    d = q.shape[-1]
    mask = _causal(8, 8) if sparse_mode == 0 else COMPRESSED
    _fwd_bwd(lambda q, k, v: R.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=mask, scale=1 / math.sqrt(d),
                                                     sparse_mode=sparse_mode)[0],
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(d)),
             (q, k, v), dtype)


def test_fusion_attention_sparse_mode_3_is_bottom_right_aligned():
    q, k, v = _bnsd(s=4, skv=8)
    out3 = R.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=COMPRESSED, scale=0.25, sparse_mode=3)[0]
    out2 = R.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=COMPRESSED, scale=0.25, sparse_mode=2)[0]
    torch.testing.assert_close(out3, F.scaled_dot_product_attention(q, k, v, attn_mask=~_causal(4, 8, True), scale=0.25))
    torch.testing.assert_close(out2, F.scaled_dot_product_attention(q, k, v, attn_mask=~_causal(4, 8), scale=0.25))


def test_fusion_attention_without_mask_is_not_causal():
    q, k, v = _bnsd()
    out = R.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.25, sparse_mode=2)[0]  # documented: mode ignored
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.25))


@pytest.mark.parametrize("layout", ["BSH", "SBH", "BSND", "BNSD"])
def test_fusion_attention_layouts(layout):
    q, k, v = _bnsd()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)   # (B, N, S, D)
    to = {"BNSD": lambda t: t, "BSND": lambda t: t.transpose(1, 2).contiguous(),
          "BSH": lambda t: t.transpose(1, 2).reshape(2, 8, 64),
          "SBH": lambda t: t.permute(2, 0, 1, 3).reshape(8, 2, 64)}[layout]
    out = R.npu_fusion_attention(to(q), to(k), to(v), 4, layout, atten_mask=_causal(8, 8), scale=0.25)[0]
    torch.testing.assert_close(out, to(want), atol=1e-5, rtol=1e-5)


def test_fusion_attention_gqa_and_tnd():
    q = _rand(1, 4, 6, 16)
    k, v = _rand(1, 2, 6, 16, seed=1), _rand(1, 2, 6, 16, seed=2)
    out = R.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.25)[0]
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1),
                                                                   v.repeat_interleave(2, 1), scale=0.25))
    # TND: two packed sequences of 3 and 5 tokens, causal per sequence (cumulative lengths)
    qt, kt, vt = _rand(8, 4, 16), _rand(8, 4, 16, seed=1), _rand(8, 4, 16, seed=2)
    out = R.npu_fusion_attention(qt, kt, vt, 4, "TND", atten_mask=COMPRESSED, scale=0.25, sparse_mode=3,
                                 actual_seq_qlen=[3, 8], actual_seq_kvlen=[3, 8])
    for a, b in ((0, 3), (3, 8)):
        seg = lambda t: t[a:b].transpose(0, 1).unsqueeze(0)  # noqa: E731
        ref = F.scaled_dot_product_attention(seg(qt), seg(kt), seg(vt), is_causal=True, scale=0.25)
        torch.testing.assert_close(out[0][a:b], ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    assert out[1].shape == (4, 8, 8)
    with pytest.raises(NpuConstraintError, match="cumulative"):
        R.npu_fusion_attention(qt, kt, vt, 4, "TND", actual_seq_qlen=[3, 5], actual_seq_kvlen=[5, 3])


def test_fusion_attention_refusals_and_invalid_rows():
    q, k, v = _bnsd()
    with pytest.raises(NpuConstraintError, match="GPU convention"):
        R.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=torch.zeros(8, 8))
    with pytest.raises(NpuConstraintError, match="compressed"):
        R.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=_causal(8, 8), sparse_mode=2)
    with pytest.raises(NpuConstraintError, match="upper-triangular"):
        R.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=~COMPRESSED, sparse_mode=2)
    with pytest.raises(NpuConstraintError, match="head_num"):
        R.npu_fusion_attention(q, k, v, 8, "BNSD")
    full = torch.zeros(8, 8, dtype=torch.bool)
    full[0] = True                                    # query 0 sees no key
    assert torch.isnan(R.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=full)[0][:, :, 0]).all()
    out = R.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=full, inner_precise=2)[0]
    assert (out[:, :, 0] == 0).all() and torch.isfinite(out).all()


# --- optimizers -----------------------------------------------------------------------------------

def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in ((4, 3), (5,), (2, 2, 2))]


def _run(opt_cls, kwargs, params, steps=5, fused=False):
    opt = opt_cls(params, **kwargs)
    for t in range(steps):
        g = torch.Generator().manual_seed(100 + t)
        loss = sum((p * torch.randn(p.shape, generator=g)).sum() + (p ** 2).sum() for p in params)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False) if fused else opt.zero_grad()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("amsgrad", [False, True])
def test_fused_adamw_matches_torch_adamw_over_5_steps(amsgrad):
    kw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05, amsgrad=amsgrad)
    got = _run(R.NpuFusedAdamW, kw, _params(), fused=True)
    want = _run(torch.optim.AdamW, kw, _params())
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_fused_adam_and_sgd_match_torch():
    kw = dict(lr=1e-2, weight_decay=0.01)
    for a, b in zip(_run(R.NpuFusedAdam, kw, _params(), fused=True), _run(torch.optim.Adam, kw, _params())):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    kw = dict(lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True)
    for a, b in zip(_run(R.NpuFusedSGD, kw, _params(), fused=True), _run(torch.optim.SGD, kw, _params())):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_fused_optimizer_caveats():
    params = _params()
    opt = R.NpuFusedAdamW(params, lr=1e-3)
    with pytest.raises(ValueError, match="set_to_none"):
        opt.zero_grad(set_to_none=True)
    sum(p.sum() for p in params).backward()
    opt.step()
    opt.zero_grad()
    assert all(p.grad is not None and not p.grad.any() for p in params)
    params[0].data = torch.zeros(4, 3)          # re-created after packing
    sum(p.sum() for p in params).backward()
    with pytest.raises(R.ParamsRecreatedError, match="re-created"):
        opt.step()


def test_clip_grad_norm_fused_matches_torch():
    a, b = _params(), _params()
    for ps in (a, b):
        sum((p ** 3).sum() for p in ps).backward()
    opt = R.NpuFusedSGD(a, lr=0.1)
    n1 = opt.clip_grad_norm_fused_(1.0)
    n2 = torch.nn.utils.clip_grad_norm_(b, 1.0)
    torch.testing.assert_close(n1, n2)
    for x, y in zip(a, b):
        torch.testing.assert_close(x.grad, y.grad, atol=1e-6, rtol=1e-5)


def test_apply_adam_w_takes_powers_before_the_step():
    p = _params()[0]
    ref = torch.nn.Parameter(p.detach().clone())
    topt = torch.optim.AdamW([ref], lr=0.01, weight_decay=0.1)
    var, m, v = p.detach().clone(), torch.zeros_like(p), torch.zeros_like(p)
    for t in (1, 2, 3):
        grad = _rand(4, 3, seed=t)
        ref.grad = grad.clone()
        topt.step()
        R.npu_apply_adam_w(0.9 ** (t - 1), 0.999 ** (t - 1), 0.01, 0.1, 0.9, 0.999, 1e-8, grad, None, False, False,
                           out=(var, m, v))
    torch.testing.assert_close(var, ref.detach(), atol=1e-6, rtol=1e-6)
