"""A second, independent reading of the run-time-compiled CUDA cross-entropy kernel.

The records from 79 on compile `ce_fwd_bwd_kernel` with NVRTC (`torch.cuda._compile_kernel`),
which needs a CUDA GPU: no interpreter can run it here. Its replacement is therefore checked
against this reference, written separately from the replacement and in the kernel's own shape
(one CUDA block per row, the same phases in the same order: sigmoid into shared memory in bf16,
block maximum, block sum, loss by thread 0, gradient of every column, then the target columns
rewritten with their -w_k terms). A check against it says the replacement computes what the
CUDA source says; it does not say the kernel itself was run, and the check result says so.
"""

from __future__ import annotations

import torch

E5M2_MAX = 57344.0


def _satfinite_e5m2(x: torch.Tensor) -> torch.Tensor:
    """cvt.rn.satfinite.e5m2: nearest even, overflow saturates at +-57344, NaN stays NaN."""
    return torch.where(x.isnan(), x, x.clamp(-E5M2_MAX, E5M2_MAX)).to(torch.float8_e5m2)


def _block_softmax(row_logits, A, inv_C, B_div_C):
    """One block's first phases: the tanh-form sigmoid into shared memory in bf16, the block
    maximum of A * sigmoid (unrounded), the block sum over the bf16 values, lse."""
    sig = 0.5 + torch.tanh((row_logits.to(torch.float32) * inv_C + B_div_C) * 0.5) * 0.5
    smem = sig.to(torch.bfloat16)
    block_max = (A * sig).max()
    return smem, block_max + torch.log(torch.exp(A * smem.to(torch.float32) - block_max).sum())


def ce_fwd_bwd(logits, targets, mtp_weights, losses, grad_input, n_rows, n_predict, A, B, C, grad_s,
               grad_scale) -> None:
    vocab = logits.shape[1]
    f32 = torch.float32
    A, B, C = (torch.tensor(v, dtype=f32) for v in (A, B, C))
    grad_s, grad_scale = torch.tensor(grad_s, dtype=f32), torch.tensor(grad_scale, dtype=f32)
    inv_C = 1 / C
    B_div_C = B * inv_C
    weights = [float(w) for w in mtp_weights.float()]
    tgt = [int(t) for t in targets]
    S_w = torch.tensor(0.0, dtype=f32)
    for i in range(n_predict):  # every thread sums all n_predict weights
        S_w = S_w + weights[i]
    for row in range(n_rows):  # one CUDA block
        smem, lse = _block_softmax(logits[row], A, inv_C, B_div_C)
        total = torch.tensor(0.0, dtype=f32)
        for k in range(n_predict):
            if row + k < n_rows:
                t = tgt[row + k]
                if 0 <= t < vocab:
                    total = total + weights[k] * (lse - A * smem[t].to(f32))
        losses[row] = total
        su = smem.to(f32)
        p = torch.exp(A * su - lse)
        grad_x = grad_scale * (1.0 / C * A) * (1.0 / grad_s) * (S_w * p - 0.0) * su * (1.0 - su)
        grad_input[row] = _satfinite_e5m2(grad_x)
        for i in range(n_predict):  # threads 0 .. n_predict-1 after __syncthreads
            if row + i >= n_rows:
                continue
            t = tgt[row + i]
            if not 0 <= t < vocab:  # the kernel would write out of bounds: nothing defined to compare
                continue
            s_t = smem[t].to(f32)
            p_t = torch.exp(A * s_t - lse)
            term2 = 0.0
            for k in range(3):
                if row + k < n_rows and k < n_predict and tgt[row + k] == t:
                    term2 += weights[k]
            g = grad_scale * (1.0 / C * A) * (1.0 / grad_s) * (S_w * p_t - term2) * s_t * (1.0 - s_t)
            grad_input[row, t] = _satfinite_e5m2(g.reshape(1))[0]


def ce_fwd_bwd_prefix(logits, targets, mtp_weights, prefix_targets, prefix_weight, losses, grad_input, n_rows,
                      n_predict, A, B, C, grad_s, grad_scale) -> None:
    """The record-88 kernel: `ce_fwd_bwd` plus a prefix-token prediction per row. Thread 0 adds
    w_p * (lse - z[T']) when T' = prefix_targets[row] is a class; S_w starts at w_p (valid T')
    and adds every mtp weight; threads 0 .. n_predict rewrite the columns of the valid MTP targets
    and of T', each with term2 = the weights of every prediction landing on that column."""
    vocab = logits.shape[1]
    f32 = torch.float32
    A, B, C = (torch.tensor(v, dtype=f32) for v in (A, B, C))
    grad_s, grad_scale = torch.tensor(grad_s, dtype=f32), torch.tensor(grad_scale, dtype=f32)
    inv_C = 1 / C
    B_div_C = B * inv_C
    weights = [float(w) for w in mtp_weights.float()]
    w_p = float(prefix_weight.float().reshape(-1)[0])
    tgt = [int(t) for t in targets]
    coef = grad_scale * (1.0 / C * A) * (1.0 / grad_s)
    for row in range(n_rows):
        smem, lse = _block_softmax(logits[row], A, inv_C, B_div_C)
        t_p = int(prefix_targets[row])
        p_valid = 0 <= t_p < vocab
        total = torch.tensor(0.0, dtype=f32)
        for k in range(n_predict):
            if row + k < n_rows and 0 <= tgt[row + k] < vocab:
                total = total + weights[k] * (lse - A * smem[tgt[row + k]].to(f32))
        if p_valid:
            total = total + w_p * (lse - A * smem[t_p].to(f32))
        losses[row] = total
        S_w = torch.tensor(w_p if p_valid else 0.0, dtype=f32)
        for i in range(n_predict):
            S_w = S_w + weights[i]
        su = smem.to(f32)
        grad_input[row] = _satfinite_e5m2(coef * (S_w * torch.exp(A * su - lse)) * su * (1.0 - su))
        for i in range(n_predict + 1):  # thread n_predict handles the prefix target
            if i < n_predict:
                valid = row + i < n_rows and 0 <= tgt[row + i] < vocab
                t = tgt[row + i] if valid else -1
            else:
                t, valid = t_p, p_valid
            if not valid:
                continue
            s_t = smem[t].to(f32)
            term2 = 0.0
            for k in range(n_predict):
                if row + k < n_rows and tgt[row + k] == t:
                    term2 += weights[k]
            if p_valid and t_p == t:
                term2 += w_p
            g = coef * (S_w * torch.exp(A * s_t - lse) - term2) * s_t * (1.0 - s_t)
            grad_input[row, t] = _satfinite_e5m2(g.reshape(1))[0]
