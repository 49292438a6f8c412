"""Small GPU training programs in the forms of the Modded-NanoGPT record scripts, with Triton kernels.

Written for these tests (no record code): a script that defines its own symmetric-matmul
kernels for a Newton-Schulz step (autotuned, as in records 27-60), and a main script importing
a `triton_kernels.py` extra file (records 61+) with a fused linear + ReLU^2 autograd.Function,
a softcapped cross-entropy with forward and backward kernels, and a launcher wrapped in a
`torch.library.custom_op`. `UNKNOWN_KERNELS` holds a kernel no catalog entry describes.
The programs run on "cuda" as written; the tests port them.
"""

from __future__ import annotations

GRAM_KERNELS = '''
@triton.jit
def _gram_kernel(x_ptr, out_ptr, M, K, sxb, sxm, sxk, sob, som, son, ALPHA_BETA: tl.constexpr, alpha, beta,
                 BM: tl.constexpr, BK: tl.constexpr):
    """out[b] = X[b] @ X[b].T, or alpha * X @ X.T + beta * X for square X when ALPHA_BETA."""
    i = tl.program_id(0)
    j = tl.program_id(1)
    bat = tl.program_id(2)
    rows = i * BM + tl.arange(0, BM)
    cols = j * BM + tl.arange(0, BM)
    ks = tl.arange(0, BK)
    acc = tl.zeros((BM, BM), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + ks
        xi = tl.load(x_ptr + bat * sxb + rows[:, None] * sxm + kk[None, :] * sxk,
                     mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
        xj = tl.load(x_ptr + bat * sxb + cols[:, None] * sxm + kk[None, :] * sxk,
                     mask=(cols[:, None] < M) & (kk[None, :] < K), other=0.0)
        acc = tl.dot(xi, tl.trans(xj), acc)
    inside = (rows[:, None] < M) & (cols[None, :] < M)
    if ALPHA_BETA:
        x = tl.load(x_ptr + bat * sxb + rows[:, None] * sxm + cols[None, :] * sxk, mask=inside, other=0.0)
        acc = acc * alpha + x.to(tl.float32) * beta
    tl.store(out_ptr + bat * sob + rows[:, None] * som + cols[None, :] * son, acc.to(out_ptr.dtype.element_ty),
             mask=inside)
'''

GRAM_KERNELS_AUTOTUNED = GRAM_KERNELS.replace(
    "@triton.jit\ndef _gram_kernel",
    '@triton.autotune(configs=_gram_configs(), key=["M", "K"])\n@triton.jit\ndef _gram_kernel')

GRAM_LAUNCHERS = '''
def XXT(A: torch.Tensor, out: torch.Tensor):
    """out = A @ A.mT"""
    batch = A.size(0) if A.ndim == 3 else 1
    M, K = A.shape[-2:]
    grid = lambda meta: (triton.cdiv(M, meta["BM"]), triton.cdiv(M, meta["BM"]), batch)
    _gram_kernel[grid](A, out, M, K, A.stride(0) if A.ndim == 3 else 0, A.stride(-2), A.stride(-1),
                       out.stride(0) if out.ndim == 3 else 0, out.stride(-2), out.stride(-1), False, 1.0, 0.0)
    return out


def ba_plus_cAA(A: torch.Tensor, alpha: float, beta: float, out: torch.Tensor):
    """out = alpha * A @ A.mT + beta * A"""
    batch = A.size(0) if A.ndim == 3 else 1
    M, K = A.shape[-2:]
    grid = lambda meta: (triton.cdiv(M, meta["BM"]), triton.cdiv(M, meta["BM"]), batch)
    _gram_kernel[grid](A, out, M, K, A.stride(0) if A.ndim == 3 else 0, A.stride(-2), A.stride(-1),
                       out.stride(0) if out.ndim == 3 else 0, out.stride(-2), out.stride(-1), True, alpha, beta)
    return out
'''

NEWTON_SCHULZ_SCRIPT = '''\
import os
import sys
import torch
import torch.nn as nn
import triton
import triton.language as tl


def _gram_configs():
    return [triton.Config({"BM": bm, "BK": 32}, num_warps=4) for bm in (32, 64)]

''' + GRAM_KERNELS_AUTOTUNED + GRAM_LAUNCHERS + '''

@torch.compile
def newton_schulz(G: torch.Tensor):
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.bfloat16()
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = (X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)).contiguous()
    A = torch.empty((*X.shape[:-1], X.size(-2)), device=X.device, dtype=X.dtype)
    B = torch.empty_like(A)
    C = torch.empty_like(X)
    for _ in range(5):
        XXT(X, out=A)
        ba_plus_cAA(A, alpha=c, beta=b, out=B)
        torch.addmm(X, B, X, beta=a, out=C)
        X, C = C, X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


print(f"Running Triton version {triton.__version__}")
torch.manual_seed(0)
device = "cuda"
model = nn.Sequential(nn.Linear(32, 64, bias=False), nn.ReLU(), nn.Linear(64, 32, bias=False)).to(device)
data = torch.randn(16, 32, device=device)
for step in range(3):
    loss = (model(data) - data).square().mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(newton_schulz(p.grad).to(p.dtype), alpha=-0.02)
            p.grad = None
    print(f"step:{step} loss:{loss.item():.4f}")
print("done")
'''

RELU2_AND_CE_KERNELS = '''
@triton.jit
def _relu2_kernel(a_ptr, b_ptr, c_ptr, aux_ptr, M, N, K, sam, sbn, scm,
                  FORWARD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """FORWARD: c = a @ b.T, aux = relu(c)^2; else c = 2 * (a @ b.T) * relu(aux). bf16 results."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + ks
        a = tl.load(a_ptr + rows[:, None] * sam + kk[None, :], mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + cols[:, None] * sbn + kk[None, :], mask=(cols[:, None] < N) & (kk[None, :] < K), other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
    c = acc.to(tl.bfloat16)
    inside = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * scm + cols[None, :]
    if FORWARD:
        tl.store(c_ptr + offs, c, mask=inside)
        r = tl.maximum(c, 0.0)
        tl.store(aux_ptr + offs, r * r, mask=inside)
    else:
        pre = tl.load(aux_ptr + offs, mask=inside, other=0.0)
        tl.store(c_ptr + offs, 2 * c * tl.where(pre > 0, pre, 0.0), mask=inside)


def linear_relu_square(a, b, aux=None):
    M, K = a.shape
    N = b.shape[0]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    forward = aux is None
    if forward:
        aux = torch.empty((M, N), device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
    _relu2_kernel[grid](a, b, c, aux, M, N, K, a.stride(0), b.stride(0), c.stride(0),
                        FORWARD=forward, BM=64, BN=64, BK=32)
    return (c, aux) if forward else c


class FusedLinearReLUSquareFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, W1, W2):
        pre, post = linear_relu_square(x.view((-1, x.shape[-1])), W1)
        ctx.save_for_backward(x, W1, W2, pre, post)
        return (post @ W2).view(x.shape)

    @staticmethod
    def backward(ctx, grad_output):
        x, W1, W2, pre, post = ctx.saved_tensors
        g = grad_output.reshape(-1, grad_output.shape[-1])
        dW2 = post.T @ g
        dpre = linear_relu_square(g, W2, aux=pre)
        return (dpre @ W1).view(x.shape), dpre.T @ x.view(-1, x.shape[-1]), dW2


@triton.jit
def _softcap_ce_fwd(logits_ptr, loss_ptr, lse_ptr, tgt_ptr, w_ptr, stride, n_rows, n_cols, n_pred, A, B, C,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(logits_ptr + row * stride + cols, mask=inside, other=0.0).to(tl.float32)
    z = tl.where(inside, A * tl.sigmoid((x + B) / C), float("-inf"))
    top = tl.max(z, axis=0)
    lse = top + tl.log(tl.sum(tl.exp(z - top), axis=0))
    tl.store(lse_ptr + row, lse)
    loss = 0.0
    for k in range(n_pred):
        if row + k < n_rows:
            w = tl.load(w_ptr + k)
            t = tl.load(tgt_ptr + row + k)
            if (w > 0) & (t >= 0) & (t < n_cols):
                xt = tl.load(logits_ptr + row * stride + t).to(tl.float32)
                loss += w * (lse - A * tl.sigmoid((xt + B) / C))
    tl.store(loss_ptr + row, loss)


@triton.jit
def _softcap_ce_bwd(grad_ptr, dloss_ptr, lse_ptr, logits_ptr, tgt_ptr, w_ptr, stride, n_rows, n_cols, n_pred,
                    A, B, C, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(logits_ptr + row * stride + cols, mask=inside, other=0.0).to(tl.float32)
    s = tl.sigmoid((x + B) / C)
    p = tl.exp(A * s - tl.load(lse_ptr + row))
    w_sum = 0.0
    hits = tl.zeros([BLOCK], dtype=tl.float32)
    for k in range(n_pred):
        if row + k < n_rows:
            w = tl.load(w_ptr + k)
            w_sum += w
            hits += tl.where(cols == tl.load(tgt_ptr + row + k), w, 0.0)
    g = tl.load(dloss_ptr + row) * (w_sum * p - hits) * (A / C) * s * (1.0 - s)
    tl.store(grad_ptr + row * stride + cols, g.to(tl.bfloat16), mask=inside)


class FusedSoftcappedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, mtp_weights, A=23.0, B=5.0, C=7.5):
        n_rows, n_cols = logits.shape
        if mtp_weights is None:
            mtp_weights = torch.tensor([1.0], device=logits.device, dtype=torch.float32)
        logits = logits.contiguous()
        losses = torch.empty(n_rows, device=logits.device, dtype=torch.float32)
        lse = torch.empty(n_rows, device=logits.device, dtype=torch.float32)
        _softcap_ce_fwd[(n_rows,)](logits, losses, lse, targets, mtp_weights, logits.stride(0), n_rows, n_cols,
                                   mtp_weights.shape[0], A, B, C, BLOCK=triton.next_power_of_2(n_cols))
        ctx.save_for_backward(logits, targets, mtp_weights, lse)
        ctx.params = (A, B, C)
        return losses

    @staticmethod
    def backward(ctx, grad_output):
        logits, targets, mtp_weights, lse = ctx.saved_tensors
        A, B, C = ctx.params
        n_rows, n_cols = logits.shape
        grad = torch.empty((n_rows, n_cols), device=logits.device, dtype=torch.bfloat16)
        _softcap_ce_bwd[(n_rows,)](grad, grad_output.contiguous(), lse, logits, targets, mtp_weights,
                                   logits.stride(0), n_rows, n_cols, mtp_weights.shape[0], A, B, C,
                                   BLOCK=triton.next_power_of_2(n_cols))
        return grad, None, None, None, None, None
'''

CUSTOM_OP_LAUNCHER = '''

@torch.library.custom_op("tbtest::gram", mutates_args={"out"})
def gram_op(A: torch.Tensor, out: torch.Tensor) -> None:
    batch = A.size(0) if A.ndim == 3 else 1
    M, K = A.shape[-2:]
    grid = (triton.cdiv(M, 32), triton.cdiv(M, 32), batch)
    _gram_kernel[grid](A, out, M, K, A.stride(0) if A.ndim == 3 else 0, A.stride(-2), A.stride(-1),
                       out.stride(0) if out.ndim == 3 else 0, out.stride(-2), out.stride(-1), False, 1.0, 0.0,
                       BM=32, BK=32)
'''

TRITON_KERNELS_FILE = '''\
import torch
import triton
import triton.language as tl
''' + GRAM_KERNELS + RELU2_AND_CE_KERNELS + CUSTOM_OP_LAUNCHER

MAIN_WITH_EXTRA_FILE = '''\
import os
import sys
with open(os.path.join(os.path.dirname(sys.argv[0]), "triton_kernels.py")) as f:
    code = f.read()  # logged with the run, as the records do
import torch
import torch.nn as nn
import triton
from triton_kernels import FusedLinearReLUSquareFunction, FusedSoftcappedCrossEntropy

print(f"Running Triton version {triton.__version__}")
torch.manual_seed(0)
device = "cuda"
vocab, dim, hidden = 96, 32, 64
emb = nn.Embedding(vocab, dim).to(device).bfloat16()
w1 = nn.Parameter(torch.randn(hidden, dim, device=device, dtype=torch.bfloat16) * dim ** -0.5)
w2 = nn.Parameter(torch.randn(hidden, dim, device=device, dtype=torch.bfloat16) * hidden ** -0.5)
head = nn.Parameter(torch.randn(vocab, dim, device=device, dtype=torch.bfloat16) * dim ** -0.5)
params = [*emb.parameters(), w1, w2, head]
opt = torch.optim.SGD(params, lr=0.5)
tokens = torch.randint(0, vocab, (65,), device=device)
mtp_weights = torch.tensor([1.0, 0.5], device=device)
gram = torch.empty(dim, dim, device=device, dtype=torch.bfloat16)
torch.ops.tbtest.gram(w1.detach().T.contiguous(), gram)
print(f"gram trace:{gram.float().trace().item():.3f}")
for step in range(3):
    x = emb(tokens[:-1])
    x = x + FusedLinearReLUSquareFunction.apply(x, w1, w2)
    logits = x @ head.T
    loss = FusedSoftcappedCrossEntropy.apply(logits, tokens[1:], mtp_weights, 23.0, 5.0, 7.5).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step:{step} loss:{loss.item():.4f}")
print("done")
'''

UNKNOWN_KERNELS = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _scaled_copy_kernel(x_ptr, y_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * alpha, mask=offs < n)


def scaled_copy(x, y, alpha):
    n = x.numel()
    _scaled_copy_kernel[(triton.cdiv(n, 256),)](x, y, n, alpha, BLOCK=256)
'''
