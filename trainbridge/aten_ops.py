"""ATen operator families, in bare names (`mm`), with the two spellings the tools use.

The dispatcher calls an operator `aten.mm` (torch_dispatch overload packets), the profiler
`aten::mm`, Inductor's graphs and kernels `mm`. Every stage that asks "is this matrix-engine
work?" picks its families here, so the sets cannot drift apart.
"""

from __future__ import annotations

from typing import Iterable

MATMUL = frozenset({"mm", "bmm", "addmm", "baddbmm"})
"""Dense matrix products with their own ATen kernels."""

MATMUL_EXTRA = frozenset({"addbmm", "_scaled_mm"})
"""Batched-sum and fp8-scaled products: rarer, counted where their time is counted."""

CONVOLUTION = frozenset({"convolution", "_convolution", "mkldnn_convolution"})
"""Forward convolutions as the dispatcher sees them (the generic op and its CPU backends)."""

CONVOLUTION_BACKWARD = frozenset({"convolution_backward"})

FUSED_ATTENTION = frozenset({
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_cudnn_attention",
})
"""scaled_dot_product_attention's fused kernels (matrix-engine work inside)."""

PRECISION_GEMMS = MATMUL | CONVOLUTION | CONVOLUTION_BACKWARD

MODEL_RANDOM = frozenset({"native_dropout", "bernoulli", "bernoulli_", "feature_dropout", "alpha_dropout",
                          "feature_alpha_dropout", "rrelu_with_noise"})
"""Random draws inside a model's math (dropout and kin): a compiled region draws other numbers
than eager unless Inductor falls back to eager's random kernels (harness `eager_random_streams`).
Data sampling (`randint` of a batch) is not here: it happens outside the regions a candidate changes."""
"""The ops whose input dtype shows a precision change (autocast, a cast to fp32)."""

GRAPH_LIBRARY_CALLS = MATMUL | {"_scaled_mm", "convolution"}
"""Matrix products an Inductor graph leaves to a library (extern kernels, not generated code)."""

EAGER_MATRIX_KERNELS = frozenset({
    "conv2d", "mkldnn_matmul", "_weight_int8pack_mm", "_mm_plus_mm", "linear_backward",
    "_flash_attention_forward", "_flash_attention_backward",
})
"""Matrix-engine kernels that show under these names in eager profiles only."""

MATRIX_ENGINE = MATMUL | MATMUL_EXTRA | CONVOLUTION | CONVOLUTION_BACKWARD | FUSED_ATTENTION | EAGER_MATRIX_KERNELS
"""Operators whose time is matrix-engine work (cube units on Ascend, tensor cores on a GPU)."""


def dispatcher_names(ops: Iterable[str]) -> frozenset[str]:
    """`mm` -> `aten.mm` (torch_dispatch's overload packet names)."""
    return frozenset(f"aten.{o}" for o in ops)


def profiler_names(ops: Iterable[str]) -> frozenset[str]:
    """`mm` -> `aten::mm` (torch.profiler's event names)."""
    return frozenset(f"aten::{o}" for o in ops)
