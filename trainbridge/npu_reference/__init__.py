"""Reference semantics of the torch_npu operators the npu target uses (contract: README.md).

Why: nothing here has an NPU, so every fused-operator rewrite is checked against a
plain-PyTorch reference with the documented signature, return structure and refusals.
These are semantics, not speed: results from them are never measurements (see
fake_torch_npu.is_reference).
"""

from __future__ import annotations

from .attention import npu_fusion_attention
from .ops import (
    NpuConstraintError,
    get_npu_format,
    inverse_sqrt_head_dim,
    npu_add_rms_norm,
    npu_confusion_transpose,
    npu_cross_entropy_loss,
    npu_fast_gelu,
    npu_format_cast,
    npu_geglu,
    npu_gelu,
    npu_rms_norm,
    npu_rotary_mul,
    npu_scaled_masked_softmax,
    npu_swiglu,
)
from .optim import NpuFusedAdam, NpuFusedAdamW, NpuFusedSGD, ParamsRecreatedError, npu_apply_adam_w

__all__ = [
    "NpuConstraintError", "ParamsRecreatedError", "NpuFusedAdam", "NpuFusedAdamW", "NpuFusedSGD",
    "get_npu_format", "inverse_sqrt_head_dim", "npu_add_rms_norm", "npu_apply_adam_w",
    "npu_confusion_transpose", "npu_cross_entropy_loss", "npu_fast_gelu", "npu_format_cast",
    "npu_fusion_attention", "npu_geglu", "npu_gelu", "npu_rms_norm", "npu_rotary_mul",
    "npu_scaled_masked_softmax", "npu_swiglu",
]
