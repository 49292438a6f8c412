"""PyTorch replacements for the Triton and NVRTC kernels of GPU training programs.

Each function or class here stands in for one launcher of a GPU program (the Python function
or autograd.Function that launched a Triton kernel, or called a CUDA kernel compiled at
run time), with the launcher's signature, return values and in-place writes to its output
arguments, so the rest of the program calls it unchanged. They are written from what each
kernel computes (the values, the dtype each result is rounded to, which outputs are written in
place), not from the kernels' code, and each is checked against the kernel itself (Triton's
interpreter on a CPU) before a port uses it; the port's ledger names the check.

Plain PyTorch only: this file is copied into the ported program as `_tb_kernels.py` and must run
where neither Triton nor TrainBridge is installed (cpu, or Ascend through torch_npu).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BF16 = torch.bfloat16
E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def to_fp8_satfinite(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round to nearest even and saturate at the largest finite value, as the GPU's fp8
    conversions do (a plain `.to()` overflows to inf or NaN instead)."""
    big = torch.finfo(dtype).max
    return x.float().clamp(-big, big).to(dtype)


# --------------------------------------------------------------------------------------------
# Symmetric products of Newton-Schulz / Polar Express (XXT, ba_plus_cAA, XTX; ns_line_1/2)

def xxt(A: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = A @ A.mT for A of shape (M, K) or (B, M, K); returns out."""
    res = A @ A.mT
    out.copy_(res)
    return out


def ba_plus_caa(A: torch.Tensor, alpha: float, beta: float, out: torch.Tensor) -> torch.Tensor:
    """out = alpha * A @ A.mT + beta * A (A square, symmetric in the callers); returns out."""
    if A.ndim == 3:
        res = torch.baddbmm(A, A, A.mT, beta=beta, alpha=alpha)
    else:
        res = torch.addmm(A, A, A.mT, beta=beta, alpha=alpha)
    out.copy_(res)
    return out


def xtx(A: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = A.mT @ A for A of shape (M, K) or (B, M, K); returns out."""
    out.copy_(A.mT @ A)
    return out


# --------------------------------------------------------------------------------------------
# Fused linear + ReLU^2 (forward: pre and post activations; backward: gradient of pre)

def _linear_relu_square(a, b, aux, a_f8=None, b_f8=None, dequant_scale=None):
    if b_f8 is not None:  # fp8 operands, fp32 accumulation, one dequantisation scale
        acc = (a_f8.float() @ b_f8.float().T) * dequant_scale.float().reshape(-1)[0]
        c = acc.to(BF16)
    else:
        c = (a @ b.T).to(BF16)
    if aux is None:
        post = c.relu().square()
        return c.to(a.dtype), post.to(a.dtype)
    return (2 * c * aux.to(BF16).relu()).to(a.dtype)


def linear_relu_square(a, b, aux=None):
    """aux None: (pre, post) = (a @ b.T, relu(a @ b.T)^2), both rounded to bf16.
    aux given (the forward's pre): 2 * (a @ b.T) * relu(aux), the gradient of pre."""
    return _linear_relu_square(a, b, aux)


def linear_relu_square_post_only(a, b, aux=None):
    """aux None: post = relu(a @ b.T)^2 alone (pre rounded to bf16, squared in bf16); the forward
    never keeps pre. aux given (the forward's post): 2 * (a @ b.T) * sqrt(post), since
    relu(pre) = sqrt(post), computed in fp32 and rounded once."""
    c = (a @ b.T).to(BF16)
    if aux is None:
        return c.relu().square().to(a.dtype)
    return (2 * c.float() * aux.float().sqrt()).to(a.dtype)


def linear_relu_square_fp8_up(a, b, aux=None, a_f8=None, b_f8=None, dequant_scale_ptr=None):
    """`linear_relu_square` whose forward product may come from fp8 operands `a_f8 @ b_f8.T`
    times the one-element `dequant_scale_ptr`."""
    if b_f8 is not None:
        assert dequant_scale_ptr is not None
    return _linear_relu_square(a, b, aux, a_f8, b_f8, dequant_scale_ptr)


def linear_relu_square_fp8_up_down(a, b, aux=None, a_f8=None, b_f8=None, dequant_scale_ptr=None,
                                   activation_scale=None, partial_amax=None):
    """`linear_relu_square_fp8_up` that, given `activation_scale`, also returns post quantised to
    e4m3 (post / scale, capped at 448) and writes the largest post value into `partial_amax`
    (every entry: the kernel wrote one per SM and its readers take the maximum)."""
    if b_f8 is not None:
        assert dequant_scale_ptr is not None
    out = _linear_relu_square(a, b, aux, a_f8, b_f8, dequant_scale_ptr)
    if activation_scale is None:
        return out
    assert aux is None and b_f8 is not None and partial_amax is not None
    c, post = out
    post32 = post.float()
    inv = 1.0 / activation_scale.float().reshape(-1)[0]
    post_f8 = torch.clamp(post32 * inv, max=448.0).to(E4M3)
    partial_amax.copy_(post32.max().clamp_min(0.0).expand_as(partial_amax))
    return c, post, post_f8


# --------------------------------------------------------------------------------------------
# FP8 delayed scaling of the MLP down projection

def reduce_mlp_activation_scales(partial_amax, scales, headroom=1.25):
    """scales[l] = max(max_j partial_amax[l, j], 1e-12) * headroom / 448 for each row l."""
    num_layers = partial_amax.shape[0]
    assert scales.numel() >= num_layers
    vals = partial_amax.float().amax(dim=1).clamp_min(1.0e-12) * (headroom / 448.0)
    scales.view(-1)[:num_layers].copy_(vals)


def quantize_transpose_mlp_down_weights(weights, output_storage, next_scales, used_scales, partial_amax,
                                        headroom=1.12):
    """output_storage[l] = e4m3(clamp(weights[l] / next_scales[l], +-448)).T; used_scales[l] =
    next_scales[l]; partial_amax[l, tile] = max |weights[l]| over each 64x64 tile (row-major
    tiles); then next_scales from partial_amax as `reduce_mlp_activation_scales` does.

    A partial_amax with more tile columns than the weights have (a buffer the program sized for
    its full-size weights, e.g. `torch.empty(12, 576)`, kept when the port scales the model
    down) gets 0 in the columns past the last tile: |W| maxima are >= 0, so no scale changes."""
    num_layers, hidden_dim, model_dim = weights.shape
    assert output_storage.shape == (num_layers, model_dim, hidden_dim)
    w = weights.float()
    scale = next_scales.view(-1)[:num_layers].float().view(num_layers, 1, 1)
    q = (w / scale).clamp(-448.0, 448.0)
    output_storage.copy_(q.transpose(1, 2).to(E4M3))
    nh, nd = cdiv(hidden_dim, 64), cdiv(model_dim, 64)
    assert partial_amax.dim() == 2 and partial_amax.shape[0] == num_layers and partial_amax.shape[1] >= nh * nd
    padded = F.pad(w.abs(), (0, nd * 64 - model_dim, 0, nh * 64 - hidden_dim))
    partial_amax.zero_()
    partial_amax[:, :nh * nd].copy_(padded.view(num_layers, nh, 64, nd, 64).amax(dim=(2, 4))
                                    .reshape(num_layers, nh * nd))
    used_scales.view(-1)[:num_layers].copy_(next_scales.view(-1)[:num_layers])
    reduce_mlp_activation_scales(partial_amax, next_scales, headroom=headroom)


# --------------------------------------------------------------------------------------------
# Transposed copies

def transpose_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst = src.T (src (M, N), dst (N, M)), any dtype including fp8."""
    assert src.ndim == 2 and dst.ndim == 2 and dst.shape == (src.shape[1], src.shape[0])
    dst.copy_(src.T)


def transpose_add(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst += src.T (src (M, N), dst (N, M))."""
    assert src.ndim == 2 and dst.ndim == 2 and dst.shape == (src.shape[1], src.shape[0])
    dst.add_(src.T)


# --------------------------------------------------------------------------------------------
# Softcapped cross-entropy with multi-token-prediction weights
#   z = A * sigmoid((x + B) / C); loss[r] = sum_k w_k * (lse_r - z[r, t[r + k]])

def _mtp_weights(mtp_weights, like):
    if mtp_weights is None:
        return torch.tensor([1.0], device=like.device, dtype=torch.float32)
    return mtp_weights


def _softcap_sigmoid(logits, B, C):
    return torch.sigmoid(logits.float() * (1.0 / C) + B / C)


def _mtp_losses(z, lse, targets, mtp_weights, positive_only=True):
    """sum over k of w_k * (lse - z[r, t[r+k]]) where r+k is a row and t a valid class."""
    n_rows, n_cols = z.shape
    rows = torch.arange(n_rows, device=z.device)
    losses = torch.zeros(n_rows, device=z.device, dtype=torch.float32)
    for k in range(mtp_weights.shape[0]):
        idx = rows + k
        in_rows = idx < n_rows
        t = targets[idx.clamp(max=n_rows - 1)].long()
        ok = in_rows & (t >= 0) & (t < n_cols)
        w = mtp_weights[k].float()
        if positive_only:
            ok = ok & (w > 0)
        zt = z.gather(1, t.clamp(0, n_cols - 1)[:, None])[:, 0]
        losses = losses + torch.where(ok, w * (lse - zt), torch.zeros_like(zt))
    return losses


def _mtp_target_weights(targets, mtp_weights, n_rows, n_cols, max_k=None):
    """(S_w[r], term2[r, c]): the weights of the targets each row is scored against."""
    device = targets.device
    rows = torch.arange(n_rows, device=device)
    s_w = torch.zeros(n_rows, device=device, dtype=torch.float32)
    term2 = torch.zeros(n_rows, n_cols, device=device, dtype=torch.float32)
    n_predict = mtp_weights.shape[0] if max_k is None else min(max_k, mtp_weights.shape[0])
    for k in range(n_predict):
        idx = rows + k
        in_rows = idx < n_rows
        w = mtp_weights[k].float()
        s_w = s_w + torch.where(in_rows, w, torch.zeros_like(w))
        t = targets[idx.clamp(max=n_rows - 1)].long()
        ok = in_rows & (t >= 0) & (t < n_cols)
        term2.scatter_add_(1, t.clamp(0, n_cols - 1)[:, None], torch.where(ok, w, torch.zeros_like(w))[:, None])
    return s_w, term2


def _softcapped_ce_grad(logits, targets, mtp_weights, lse, grad_output, A, B, C):
    s = _softcap_sigmoid(logits, B, C)
    p = torch.exp(A * s - lse[:, None])
    s_w, term2 = _mtp_target_weights(targets, mtp_weights, *logits.shape)
    return grad_output.float()[:, None] * (s_w[:, None] * p - term2) * (A / C) * s * (1.0 - s)


def _softcapped_ce_forward(logits, targets, mtp_weights, A, B, C):
    z = A * _softcap_sigmoid(logits, B, C)
    lse = torch.logsumexp(z, dim=1)
    return _mtp_losses(z, lse, targets, mtp_weights), lse


class SoftcappedCrossEntropy(torch.autograd.Function):
    """forward(logits (N, V), targets, mtp_weights, A, B, C) -> per-row losses (fp32);
    backward: the gradient of the logits in bf16."""

    @staticmethod
    def forward(ctx, logits, targets, mtp_weights, A=23.0, B=5.0, C=7.5):
        mtp_weights = _mtp_weights(mtp_weights, logits)
        logits, targets, mtp_weights = logits.contiguous(), targets.contiguous(), mtp_weights.contiguous()
        losses, lse = _softcapped_ce_forward(logits, targets, mtp_weights, A, B, C)
        ctx.save_for_backward(logits, targets, mtp_weights, lse)
        ctx.params = (A, B, C)
        return losses

    @staticmethod
    def backward(ctx, grad_output):
        logits, targets, mtp_weights, lse = ctx.saved_tensors
        A, B, C = ctx.params
        grad = _softcapped_ce_grad(logits, targets, mtp_weights, lse, grad_output, A, B, C)
        return grad.to(BF16), None, None, None, None, None


def _scaled_matmul(a_f8, b_f8, scale_a, scale_b, out_dtype):
    """What `torch._scaled_mm` computes: (a @ b) * scale_a * scale_b, fp32 accumulation."""
    return ((a_f8.float() @ b_f8.float()) * (float(scale_a) * float(scale_b))).to(out_dtype)


class SoftcappedCrossEntropyFp8(torch.autograd.Function):
    """forward(x, targets, mtp_weights, lm_head_weight (D, V), x_s, w_s, grad_s, A, B, C): logits =
    fp8(x / x_s) @ fp8(w / w_s) * x_s * w_s in bf16, then the softcapped loss; backward: the logit
    gradient divided by grad_s in e5m2, then grad_x (bf16) and grad_w (fp32) through fp8 products."""

    @staticmethod
    def forward(ctx, x, targets, mtp_weights, lm_head_weight, x_s, w_s, grad_s, A=23.0, B=5.0, C=7.5):
        x_f8 = x.div(x_s).to(E4M3)
        w_f8 = lm_head_weight.div(w_s).to(E4M3)
        logits = _scaled_matmul(x_f8, w_f8, x_s, w_s, BF16)
        mtp_weights = _mtp_weights(mtp_weights, logits)
        targets, mtp_weights = targets.contiguous(), mtp_weights.contiguous()
        losses, lse = _softcapped_ce_forward(logits, targets, mtp_weights, A, B, C)
        ctx.save_for_backward(logits, targets, mtp_weights, lse, x_f8, w_f8)
        ctx.params = (A, B, C, x_s, w_s, grad_s)
        return losses

    @staticmethod
    def backward(ctx, grad_output):
        logits, targets, mtp_weights, lse, x_f8, w_f8 = ctx.saved_tensors
        A, B, C, x_s, w_s, grad_s = ctx.params
        grad = _softcapped_ce_grad(logits, targets, mtp_weights, lse, grad_output, A, B, C)
        grad_input = to_fp8_satfinite(grad * (1.0 / grad_s), E5M2)
        grad_x = _scaled_matmul(grad_input, w_f8.T, grad_s, w_s, BF16)
        grad_w = _scaled_matmul(x_f8.T, grad_input, x_s, grad_s, torch.float32)
        return grad_x, None, None, grad_w, None, None, None


def _nvrtc_ce_softmax(logits, n_rows, A, B, C):
    """The NVRTC kernel's softmax phase: the sigmoid rounded to bf16 (s, as fp32), and the
    log-sum-exp of A * s whose maximum uses the unrounded sigmoid."""
    s32 = torch.sigmoid(logits[:n_rows].float() * (1.0 / C) + B / C)
    s = s32.to(BF16).float()
    row_max = (A * s32).amax(dim=1)
    return s, row_max + torch.log(torch.exp(A * s - row_max[:, None]).sum(dim=1))


def ce_fwd_bwd(logits, targets, mtp_weights, losses, grad_input, n_rows, n_predict, A, B, C, grad_s,
               grad_scale) -> None:
    """The fused softcapped cross-entropy forward and backward (the run-time compiled CUDA
    kernel): writes per-row losses and the logit gradient, already multiplied by the loss
    gradient `grad_scale` and divided by `grad_s`, in e5m2. Its numbers: the sigmoid is rounded
    to bf16 (the maximum uses it unrounded), every mtp weight counts in S_w, a loss term needs a
    valid target but no positive weight, and only the first three predictions are subtracted
    at the target columns."""
    n_cols = logits.shape[1]
    s, lse = _nvrtc_ce_softmax(logits, n_rows, A, B, C)
    w = mtp_weights[:n_predict].float()
    losses[:n_rows].copy_(_mtp_losses(A * s, lse, targets, w, positive_only=False))
    coef = grad_scale * (A / C) * (1.0 / grad_s)
    grad = coef * (w.sum() * torch.exp(A * s - lse[:, None])) * s * (1.0 - s)
    s_w, term2 = _mtp_target_weights(targets, w, n_rows, n_cols, max_k=3)
    rows = torch.arange(n_rows, device=logits.device)
    for i in range(n_predict):  # only the columns of this row's targets get the -w_k terms
        idx = rows + i
        t = targets[idx.clamp(max=n_rows - 1)].long()
        ok = (idx < n_rows) & (t >= 0) & (t < n_cols)
        tc = t.clamp(0, n_cols - 1)[:, None]
        st = s.gather(1, tc)[:, 0]
        pt = torch.exp(A * st - lse)
        gt = coef * (w.sum() * pt - term2.gather(1, tc)[:, 0]) * st * (1.0 - st)
        grad.scatter_(1, tc, torch.where(ok, gt, grad.gather(1, tc)[:, 0])[:, None])
    grad_input[:n_rows].copy_(to_fp8_satfinite(grad, E5M2))


def ce_fwd_bwd_prefix(logits, targets, mtp_weights, prefix_targets, prefix_weight, losses, grad_input, n_rows,
                      n_predict, A, B, C, grad_s, grad_scale) -> None:
    """`ce_fwd_bwd` with one more prediction per row: the prefix token `prefix_targets[r]`
    (negative: none) weighted by the one-element `prefix_weight`. It adds a loss term, joins S_w
    when valid, and its column gets the -weight term like the MTP targets; every prediction
    (not only the first three) is subtracted at its target column."""
    n_cols = logits.shape[1]
    s, lse = _nvrtc_ce_softmax(logits, n_rows, A, B, C)
    w = mtp_weights[:n_predict].float()
    pw = prefix_weight.float().reshape(-1)[0]
    pt = prefix_targets[:n_rows].long()
    p_ok = (pt >= 0) & (pt < n_cols)
    ptc = pt.clamp(0, n_cols - 1)
    z = A * s
    p_loss = torch.where(p_ok, pw * (lse - z.gather(1, ptc[:, None])[:, 0]), torch.zeros_like(lse))
    losses[:n_rows].copy_(_mtp_losses(z, lse, targets, w, positive_only=False) + p_loss)
    s_w = torch.where(p_ok, pw, torch.zeros_like(lse))
    for i in range(n_predict):  # the kernel starts from the prefix weight, then adds each mtp weight
        s_w = s_w + w[i]
    _, term2 = _mtp_target_weights(targets, w, n_rows, n_cols)
    term2.scatter_add_(1, ptc[:, None], torch.where(p_ok, pw, torch.zeros_like(pw))[:, None])
    # term2 is nonzero exactly at the columns the kernel rewrites, and its rewrite is the
    # every-column formula with term2 in it: one expression covers both.
    coef = grad_scale * (A / C) * (1.0 / grad_s)
    grad = coef * (s_w[:, None] * torch.exp(z - lse[:, None]) - term2) * s * (1.0 - s)
    grad_input[:n_rows].copy_(to_fp8_satfinite(grad, E5M2))


# --------------------------------------------------------------------------------------------
# Post-only dynamically composable (DC) attention correction over a sliding window
#   p_h[t, s] = softmax over s in (t - W, t] of the same document of q_h[t] . k_h[s] * scaling
#   a[t, s] = sum_h w1[t, h] p_h[t, s];  out[t, h] = base[t, h] + sum_s bf16(w2[t, h] a[t, s]) v_h[s]

_DC_BLOCK = 128


def dc_build_doc_bounds_tables(cu_seqlens, T, n_docs, cu_search_iters):
    """(doc_start[t], doc_end[t]) int32 for t < T: the document of t in cu_seqlens."""
    q = torch.arange(T, device=cu_seqlens.device).clamp(max=T - 1)
    bounds = cu_seqlens[:n_docs].contiguous().to(torch.int64)
    idx = (torch.searchsorted(bounds, q, right=True) - 1).clamp(min=0)
    cu = cu_seqlens.to(torch.int64)
    return cu[idx].to(torch.int32), cu[idx + 1].to(torch.int32)


def _dc_block(q, k, doc_start, doc_end, t0, t1, window, scaling):
    """Scores of rows [t0, t1) against keys [ks, t1): (H, rows, keys) fp32, valid mask, ks."""
    ks = max(0, t0 - window + 1)
    qb = q[0, t0:t1].transpose(0, 1).float()
    kb = k[0, ks:t1].transpose(0, 1).float()
    tq = torch.arange(t0, t1, device=q.device)[:, None]
    tk = torch.arange(ks, t1, device=q.device)[None, :]
    rel = tq - tk
    valid = (rel >= 0) & (rel < window) & (tk >= doc_start[t0:t1, None].long()) & (tk < doc_end[t0:t1, None].long())
    return (qb @ kb.transpose(1, 2)) * scaling, valid, ks


def dc_correction_forward(q, k, v, post_w1, post_w2, cu_seqlens, scaling, window, block_m, return_aux=False,
                          base_out=None):
    """base_out + the DC correction (out has base_out's shape and dtype); with return_aux also
    the per-head log-sum-exp (B, T, H) fp32 and the document tables."""
    B, T, H, D = q.shape
    assert B == 1 and base_out is not None
    n_docs = int(cu_seqlens.numel() - 1)
    doc_start, doc_end = dc_build_doc_bounds_tables(cu_seqlens, T, n_docs, max(1, n_docs.bit_length()))
    base = base_out.reshape(T, H, D)
    out_view = torch.empty((T, H, D), device=q.device, dtype=base_out.dtype)
    lse_all = torch.empty((B, T, H), device=q.device, dtype=torch.float32)
    for t0 in range(0, T, _DC_BLOCK):
        t1 = min(T, t0 + _DC_BLOCK)
        s, valid, ks = _dc_block(q, k, doc_start, doc_end, t0, t1, int(window), float(scaling))
        s = s.masked_fill(~valid, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # (H, rows)
        p = torch.exp(s - lse[..., None]).masked_fill(~valid, 0.0)
        w1 = post_w1[0, t0:t1].float().transpose(0, 1)  # (H, rows)
        w2 = post_w2[0, t0:t1].float().transpose(0, 1)
        a = (w1[..., None] * p).sum(dim=0)  # (rows, keys)
        cw = (w2[..., None] * a[None]).to(v.dtype).float()  # (H, rows, keys)
        corr = cw @ v[0, ks:t1].transpose(0, 1).float()  # (H, rows, D)
        out_view[t0:t1] = (corr.transpose(0, 1) + base[t0:t1].float()).to(out_view.dtype)
        lse_all[0, t0:t1] = lse.transpose(0, 1)
    out = torch.empty_like(base_out)
    out.copy_(out_view.view(base_out.shape))
    if return_aux:
        return out, lse_all, doc_start, doc_end
    return out


def dc_correction_backward(q, k, v, post_w1, post_w2, cu_seqlens, doc_start_table, doc_end_table, softmax_lse,
                           grad_out, scaling, window, skip_qk_grad_requested=False):
    """Gradients of the DC correction: (dq, dk, dv, d post_w1, d post_w2), dq and dk None when
    `skip_qk_grad_requested`."""
    B, T, H, D = q.shape
    assert B == 1
    window, scaling = int(window), float(scaling)
    do = grad_out.reshape(T, H, D)
    lse_th = softmax_lse.reshape(T, H) if softmax_lse.ndim != 2 else softmax_lse.transpose(0, 1)
    dq = torch.zeros((T, H, D), device=q.device, dtype=torch.float32)
    dk = torch.zeros((T, H, D), device=q.device, dtype=torch.float32)
    dv = torch.zeros((T, H, D), device=q.device, dtype=torch.float32)
    g1 = torch.empty((T, H), device=q.device, dtype=torch.float32)
    g2 = torch.empty((T, H), device=q.device, dtype=torch.float32)
    for t0 in range(0, T, _DC_BLOCK):
        t1 = min(T, t0 + _DC_BLOCK)
        s, valid, ks = _dc_block(q, k, doc_start_table, doc_end_table, t0, t1, window, scaling)
        lse = lse_th[t0:t1].float().transpose(0, 1)  # (H, rows)
        p = torch.exp(s - lse[..., None]).masked_fill(~valid, 0.0)
        w1 = post_w1[0, t0:t1].float().transpose(0, 1)
        w2 = post_w2[0, t0:t1].float().transpose(0, 1)
        a = (w1[..., None] * p).sum(dim=0)
        dob = do[t0:t1].transpose(0, 1)  # (H, rows, D)
        vb = v[0, ks:t1].transpose(0, 1).float()
        dm = dob.float() @ vb.transpose(1, 2)  # (H, rows, keys)
        g2[t0:t1] = (dm * a[None]).sum(dim=-1).transpose(0, 1)
        dvw = (w2[..., None] * a[None]).to(do.dtype).float()
        dv[ks:t1] += (dvw.transpose(1, 2) @ dob.float()).transpose(0, 1)
        da = (w2[..., None] * dm).sum(dim=0).masked_fill(~valid, 0.0)  # (rows, keys)
        soft_dot = ((w1[..., None] * da[None]) * p).sum(dim=-1)  # (H, rows)
        g1[t0:t1] = (da[None] * p).sum(dim=-1).transpose(0, 1)
        if skip_qk_grad_requested:
            continue
        ds = p * (w1[..., None] * da[None] - soft_dot[..., None])
        qb = q[0, t0:t1].transpose(0, 1)
        kb = k[0, ks:t1].transpose(0, 1)
        dq[t0:t1] = ((ds.to(k.dtype).float() @ kb.float()) * scaling).transpose(0, 1)
        dk[ks:t1] += ((ds.transpose(1, 2).to(q.dtype).float() @ qb.float()) * scaling).transpose(0, 1)
    gpost_w1 = g1.view(1, T, H).to(post_w1.dtype)
    gpost_w2 = g2.view(1, T, H).to(post_w2.dtype)
    dv = dv.view(1, T, H, D).to(v.dtype)
    if skip_qk_grad_requested:
        return None, None, dv, gpost_w1, gpost_w2
    return dq.view(1, T, H, D).to(q.dtype), dk.view(1, T, H, D).to(k.dtype), dv, gpost_w1, gpost_w2


def dc_is_supported_postonly(q, k, v, post_w1, post_w2, seq_lens) -> bool:
    """The launcher's shape and dtype guard without its `is_cuda` checks (any device)."""
    return (q.ndim == 4 and k.shape == q.shape and v.shape == q.shape and post_w1.shape == q.shape[:3]
            and post_w2.shape == q.shape[:3] and q.shape[0] == 1 and seq_lens.numel() >= 2
            and q.dtype in (torch.float16, torch.bfloat16) and k.dtype == q.dtype and v.dtype == q.dtype
            and post_w1.dtype == q.dtype and post_w2.dtype == q.dtype)
