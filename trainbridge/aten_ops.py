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


FLOOR_KERNELS = MATMUL | MATMUL_EXTRA | CONVOLUTION | CONVOLUTION_BACKWARD | FUSED_ATTENTION
"""Kernels whose calls (op, argument shapes and dtypes) the op-count step records, so the step's
floor can replay each at its own shapes (profile/floor.py)."""


def dispatcher_names(ops: Iterable[str]) -> frozenset[str]:
    """`mm` -> `aten.mm` (torch_dispatch's overload packet names)."""
    return frozenset(f"aten.{o}" for o in ops)


def profiler_names(ops: Iterable[str]) -> frozenset[str]:
    """`mm` -> `aten::mm` (torch.profiler's event names)."""
    return frozenset(f"aten::{o}" for o in ops)


# ---------------------------------------------------------------- elementwise work ----
# What the elementwise-work count (harness.elementwise) counts, in bare overload-packet names
# with any trailing `_` (in place) removed. Anything not here is decomposed into these (torch's
# own decompositions, run on meta tensors), given a formula, or, failing all three, reported as
# opaque.

ELEMENTWISE_ARITHMETIC = frozenset({
    "add", "sub", "rsub", "mul", "div", "neg", "reciprocal", "pow", "square", "sqrt", "rsqrt", "exp", "exp2",
    "expm1", "log", "log2", "log10", "log1p", "tanh", "sigmoid", "sin", "cos", "atan", "erf", "erfc", "abs", "sign",
    "sgn", "relu", "clamp", "clamp_min", "clamp_max", "maximum", "minimum", "where", "masked_fill", "lerp",
    "addcmul", "addcdiv", "fmod", "remainder", "floor", "ceil", "round", "trunc", "eq", "ne", "lt", "gt", "le", "ge",
    "logical_not", "logical_and", "logical_or", "bitwise_not", "bitwise_and", "bitwise_or", "isnan", "isinf",
    "nan_to_num",
})
"""One arithmetic function per element: counted as the elements it writes. Composite pointwise
ops (gelu, silu, softplus, their backwards) are not here: they decompose into these."""

REDUCTIONS = frozenset({
    "sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "std_mean", "prod", "logsumexp",
    "linalg_vector_norm", "norm", "argmax", "argmin", "any", "all", "cumsum",
})
"""Reductions: counted as the elements they read."""

DATA_MOVEMENT = frozenset({
    "to", "_to_copy", "copy", "clone", "contiguous", "view", "reshape", "_unsafe_view", "_reshape_alias", "expand",
    "permute", "transpose", "t", "slice", "select", "unsqueeze", "squeeze", "as_strided", "flatten", "unflatten",
    "narrow", "chunk", "split", "split_with_sizes", "unbind", "cat", "stack", "repeat", "tril", "triu", "diagonal",
    "unfold", "index", "index_select", "gather", "scatter", "scatter_add", "index_put", "index_add",
    "masked_select", "embedding", "embedding_dense_backward", "slice_backward", "select_backward",
    "zeros", "ones", "empty", "empty_strided", "full", "fill", "zero", "zeros_like", "ones_like", "empty_like",
    "full_like", "new_zeros", "new_ones", "new_empty", "new_full", "new_empty_strided", "scalar_tensor", "arange",
    "detach", "alias", "lift_fresh", "lift_fresh_copy", "_local_scalar_dense", "resize", "set", "item",
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "uniform", "normal", "bernoulli",
    "native_dropout", "_assert_async", "_assert_tensor_metadata", "sym_size", "sym_stride", "sym_numel",
    "record_stream", "_has_compatible_shallow_copy_type", "is_same_size",
})
"""Moves, views, fills and random draws: no arithmetic, never counted (a removed cast or copy is
a legitimate saving). Dropout counts its arithmetic through `native_dropout_backward` and the
mask multiply its decomposition does; the draw itself is data."""
