"""Plain-PyTorch reference semantics of the torch_npu fused operators (everything but attention).

Why: no NPU is reachable from here, so a rewrite that calls `torch_npu.npu_*` is checked
against these references instead. Each function has the documented signature (parameter
names, defaults, return structure) and refuses inputs the documented constraints refuse, so
a dry run fails where the NPU would. Numbers are computed in float32 and cast back, which is
what the kernels document for fp16/bf16; bit-exactness with the NPU is not claimed.
Facts and their sources: trainbridge/targets/npu_catalog.json.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class NpuConstraintError(ValueError):
    """An input the documented torch_npu operator rejects (layout, shape, dtype)."""


def check_dtype(op: str, *tensors: torch.Tensor | None, allowed=FLOAT_DTYPES) -> None:
    for t in tensors:
        if t is not None and t.dtype not in allowed:
            names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
            raise NpuConstraintError(f"{op}: dtype {t.dtype} is not supported (documented: {names})")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate_interleave(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


# --- normalisation ------------------------------------------------------------------------------

def npu_rms_norm(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    """(y, rstd): y = x * rsqrt(mean(x^2) + eps) * gamma over gamma's trailing dims; rstd float32."""
    x = self
    check_dtype("npu_rms_norm", x, gamma)
    if gamma.dtype != x.dtype:
        raise NpuConstraintError(f"npu_rms_norm: gamma dtype {gamma.dtype} must equal input dtype {x.dtype}")
    k = gamma.dim()
    if k == 0 or tuple(x.shape[-k:]) != tuple(gamma.shape):
        raise NpuConstraintError(f"npu_rms_norm: gamma shape {tuple(gamma.shape)} must equal the trailing "
                                 f"dims of input {tuple(x.shape)}")
    dims = tuple(range(-k, 0))
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    y = (xf * rstd * gamma.float()).to(x.dtype)
    return y, rstd


class _AddRmsNormNoBackward(torch.autograd.Function):
    """npu_add_rms_norm registers no backward in torch_npu: the reference fails at backward time too."""

    @staticmethod
    def forward(ctx, x1, x2, gamma, epsilon):
        x = x1.float() + x2.float()
        y, rstd = _rms_fp32(x, gamma, epsilon, x1.dtype)
        return y, rstd, x.to(x1.dtype)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(
            "npu_add_rms_norm has no backward in torch_npu (forward/inference only): the reference "
            "refuses backward the same way. For training use `x = x1 + x2; "
            "torch_npu.npu_rms_norm(x, gamma, epsilon)[0]`, or wrap it in your own autograd.Function.")


def _rms_fp32(x32: torch.Tensor, gamma: torch.Tensor, epsilon: float, out_dtype: torch.dtype):
    dims = tuple(range(-gamma.dim(), 0))
    rstd = torch.rsqrt(x32.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return (x32 * rstd * gamma.float()).to(out_dtype), rstd


def npu_add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    """(y, rstd, x_sum) with x_sum = x1 + x2; the sum is taken in float32 like the kernel's test.

    Backward raises (choice documented in README.md): torch_npu registers none, so a training
    program that differentiates through it must fail here, not on the NPU.
    """
    check_dtype("npu_add_rms_norm", x1, x2, gamma)
    if x1.shape != x2.shape or x1.dtype != x2.dtype:
        raise NpuConstraintError("npu_add_rms_norm: x1 and x2 must have the same shape and dtype")
    k = gamma.dim()
    if k == 0 or tuple(x1.shape[-k:]) != tuple(gamma.shape):
        raise NpuConstraintError(f"npu_add_rms_norm: gamma shape {tuple(gamma.shape)} must equal the trailing "
                                 f"dims of x1 {tuple(x1.shape)}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x1, x2, gamma)):
        return _AddRmsNormNoBackward.apply(x1, x2, gamma, epsilon)
    x = x1.float() + x2.float()
    y, rstd = _rms_fp32(x, gamma, epsilon, x1.dtype)
    return y, rstd, x.to(x1.dtype)


# --- rotary embedding ---------------------------------------------------------------------------

def npu_rotary_mul(input: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half"):
    """x*r1 + rotate(x)*r2; r1/r2 are full-width cos/sin (D, not D/2) broadcast to x."""
    x = input
    check_dtype("npu_rotary_mul", x, r1, r2)
    if rotary_mode not in ("half", "interleave"):
        raise NpuConstraintError(f"npu_rotary_mul: rotary_mode {rotary_mode!r} (documented: 'half', 'interleave')")
    for name, t in (("input", x), ("r1", r1), ("r2", r2)):
        if t.dim() != 4:
            raise NpuConstraintError(f"npu_rotary_mul: {name} must be 4-D (BNSD/BSND/SBND), got {tuple(t.shape)}")
    d = x.shape[-1]
    if d % 2 or d >= 896:
        raise NpuConstraintError(f"npu_rotary_mul: head dim D={d} must be even and < 896")
    if r1.shape[-1] != d or r2.shape[-1] != d:
        raise NpuConstraintError(f"npu_rotary_mul: r1/r2 last dim must be D={d} (full-width cos/sin), "
                                 f"got {r1.shape[-1]} / {r2.shape[-1]}")
    try:
        torch.broadcast_shapes(r1.shape, x.shape)
        torch.broadcast_shapes(r2.shape, x.shape)
    except RuntimeError as e:
        raise NpuConstraintError(f"npu_rotary_mul: r1/r2 must broadcast to input: {e}") from e
    rot = _rotate_half if rotary_mode == "half" else _rotate_interleave
    xf = x.float()
    return (xf * r1.float() + rot(xf) * r2.float()).to(x.dtype)


# --- gated and plain activations ----------------------------------------------------------------

def _halves(op: str, x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not -x.dim() <= dim < max(x.dim(), 1):
        raise NpuConstraintError(f"{op}: dim {dim} out of range for a {x.dim()}-D input")
    if x.shape[dim] % 2:
        raise NpuConstraintError(f"{op}: size {x.shape[dim]} of dim {dim} must be even (split in halves)")
    a, b = torch.chunk(x, 2, dim=dim)
    return a, b


def npu_swiglu(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """silu(A) * B where A, B = input.chunk(2, dim) (A is the first half)."""
    check_dtype("npu_swiglu", input)
    if not input.is_contiguous():
        raise NpuConstraintError("npu_swiglu: non-contiguous input is not supported (call .contiguous())")
    a, b = _halves("npu_swiglu", input, dim)
    return (F.silu(a.float()) * b.float()).to(input.dtype)


def npu_geglu(self: torch.Tensor, dim: int = -1, approximate: int = 1, activate_left: bool = False):
    """(out, gelu_out). activate_left=False (default) activates the RIGHT half: out = A * gelu(B)."""
    x = self
    check_dtype("npu_geglu", x)
    if approximate not in (0, 1):
        raise NpuConstraintError(f"npu_geglu: approximate must be 0 (none) or 1 (tanh), got {approximate!r}")
    a, b = _halves("npu_geglu", x, dim)
    mode = "tanh" if approximate == 1 else "none"
    gated, linear = (a, b) if activate_left else (b, a)
    g = F.gelu(gated.float(), approximate=mode)
    return (g * linear.float()).to(x.dtype), g.to(x.dtype)


def npu_gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    check_dtype("npu_gelu", input)
    if approximate not in ("none", "tanh"):
        raise NpuConstraintError(f"npu_gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return F.gelu(input.float(), approximate=approximate).to(input.dtype)


def npu_fast_gelu(input: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(1.702 x): both documented forms (A2/A3 and training series) reduce to it."""
    check_dtype("npu_fast_gelu", input)
    xf = input.float()
    return (xf * torch.sigmoid(1.702 * xf)).to(input.dtype)


# --- softmax, layout ----------------------------------------------------------------------------

def npu_scaled_masked_softmax(x: torch.Tensor, mask: torch.Tensor, scale: float = 1.0,
                              fixed_triu_mask: bool = False) -> torch.Tensor:
    """softmax(x*scale with mask==True excluded) over the last dim, in float32.

    Fully masked rows come out uniform (masked scores become the float32 minimum, not -inf):
    what the kernel does there is undocumented.
    """
    check_dtype("npu_scaled_masked_softmax", x)
    if x.dim() != 4:
        raise NpuConstraintError(f"npu_scaled_masked_softmax: x must be 4-D, got {tuple(x.shape)}")
    h, w = x.shape[-2:]
    for name, n in (("H", h), ("W", w)):
        if not (32 <= n <= 4096 and n % 32 == 0):
            raise NpuConstraintError(f"npu_scaled_masked_softmax: {name}={n} must be in [32, 4096] and a multiple of 32")
    if fixed_triu_mask:
        mask = torch.ones(h, w, dtype=torch.bool, device=x.device).triu(diagonal=1)
    if mask.dtype != torch.bool:
        raise NpuConstraintError(f"npu_scaled_masked_softmax: mask must be bool (True = masked), got {mask.dtype}")
    try:
        torch.broadcast_shapes(mask.shape, x.shape)
    except RuntimeError as e:
        raise NpuConstraintError(f"npu_scaled_masked_softmax: mask must broadcast to x: {e}") from e
    s = (x.float() * scale).masked_fill(mask, torch.finfo(torch.float32).min)
    return torch.softmax(s, dim=-1).to(x.dtype)


def npu_confusion_transpose(self: torch.Tensor, perm: Sequence[int], shape: Sequence[int],
                            transpose_first: bool) -> torch.Tensor:
    """transpose_first: reshape(permute(x, perm), shape); else permute(reshape(x, shape), perm)."""
    perm, shape = list(perm), list(shape)
    first = self.dim() if transpose_first else len(shape)
    if sorted(p % first for p in perm) != list(range(first)) or len(perm) != first:
        raise NpuConstraintError(f"npu_confusion_transpose: perm {perm} is not a permutation of {first} dims")
    if transpose_first:
        return self.permute(perm).reshape(shape)
    return self.reshape(shape).permute(perm)


def npu_format_cast(self: torch.Tensor, acl_format: int) -> torch.Tensor:
    """Identity on values (a copy): private formats (29 = FRACTAL_NZ, ...) have no CPU meaning."""
    if not isinstance(acl_format, int):
        raise NpuConstraintError(f"npu_format_cast: acl_format must be an int (2 = ND, 29 = FRACTAL_NZ), got {acl_format!r}")
    return self.clone()


def get_npu_format(self: torch.Tensor) -> int:
    """Always 2 (ND) on the reference: CPU tensors carry no private format."""
    return 2


# --- loss ---------------------------------------------------------------------------------------

def npu_cross_entropy_loss(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                           reduction: str = "mean", ignore_index: int = -100, label_smoothing: float = 0.0,
                           lse_square_scale_for_zloss: float = 0.0, return_zloss: bool = False):
    """(loss, log_prob, zloss, lse_for_zloss): log_softmax + nll_loss fused.

    loss has shape [N] for reduction='none', else [1] (the documented shape, not a 0-d scalar).
    zloss and lse_for_zloss are empty tensors: the docs mark zloss "not yet supported", so
    asking for it raises instead of returning numbers the NPU would not produce.
    """
    check_dtype("npu_cross_entropy_loss", input)
    if input.dim() != 2:
        raise NpuConstraintError(f"npu_cross_entropy_loss: input must be [N, C], got {tuple(input.shape)}")
    if target.dtype != torch.int64 or target.shape != input.shape[:1]:
        raise NpuConstraintError("npu_cross_entropy_loss: target must be int64 of shape [N]")
    if weight is not None and (weight.dtype != torch.float32 or weight.shape != input.shape[1:]):
        raise NpuConstraintError("npu_cross_entropy_loss: weight must be float32 of shape [C]")
    if reduction not in ("mean", "sum", "none"):
        raise NpuConstraintError(f"npu_cross_entropy_loss: reduction {reduction!r}")
    if not 0.0 <= label_smoothing < 1.0:
        raise NpuConstraintError("npu_cross_entropy_loss: label_smoothing must be in [0, 1)")
    if return_zloss or lse_square_scale_for_zloss != 0.0:
        raise NotImplementedError("npu_cross_entropy_loss: zloss is documented as not yet supported")
    log_prob = torch.log_softmax(input.float(), dim=-1)
    loss = F.nll_loss(log_prob, target, weight=weight, ignore_index=ignore_index, reduction=reduction) \
        if label_smoothing == 0.0 else \
        F.cross_entropy(input.float(), target, weight=weight, ignore_index=ignore_index,
                        reduction=reduction, label_smoothing=label_smoothing)
    if reduction != "none":
        loss = loss.reshape(1)
    empty = input.new_empty(0)
    return loss.to(input.dtype), log_prob.to(input.dtype), empty, empty.clone()


def inverse_sqrt_head_dim(d: int) -> float:
    """The scale npu_fusion_attention needs explicitly (its default is 1.0, not 1/sqrt(d))."""
    return 1.0 / math.sqrt(d)
