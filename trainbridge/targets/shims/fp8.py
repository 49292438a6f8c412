"""`torch._scaled_mm` for targets without FP8 matrix units.

GPU programs quantize to float8 (e4m3 for activations and weights, e5m2 for gradients),
multiply with `torch._scaled_mm`, and rescale. The CPU and the Ascend NPU have no FP8 GEMM;
the public NPU ports of these programs used bf16 matmuls instead. The port turns the float8
dtypes into bfloat16 (so the "quantized" tensors are bf16 values of the same scaled
numbers, without FP8's rounding and saturation: a semantic change the ledger records) and
routes `_scaled_mm` here: the product in the 16-bit dtype, then the scales, then the
requested output dtype.
"""

from __future__ import annotations

import torch


def scaled_mm(a: torch.Tensor, b: torch.Tensor, *args, scale_a=None, scale_b=None, bias=None, out_dtype=None,
              scale_result=None, use_fast_accum: bool = False, **kwargs) -> torch.Tensor:
    # positional form: _scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
    names = ("scale_a", "scale_b", "bias", "scale_result", "out_dtype", "use_fast_accum")
    given = dict(zip(names, args))
    scale_a = given.get("scale_a", scale_a)
    scale_b = given.get("scale_b", scale_b)
    bias = given.get("bias", bias)
    out_dtype = given.get("out_dtype", out_dtype)
    dtype = a.dtype if a.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.bfloat16
    out = torch.mm(a.to(dtype), b.to(dtype)).float()
    if scale_a is not None:
        out = out * scale_a.float()
    if scale_b is not None:
        out = out * scale_b.float()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype if out_dtype is not None else dtype)
