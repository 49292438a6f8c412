"""The pattern registry: one row per optimization pattern, read by every stage.

Evidence recognises a pattern on the GPU and offers its target operators; the planner
predicts a saving from the ATen ops the pattern's eager form spends time in; recipes and the
model's prompt realise it; the Ascend profile analysis points back at it. They used to keep
their own tables joined by strings; now they all read `PATTERNS`, and a test checks that the
recipes, the npu operator catalog and the profile rules name only patterns listed here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..aten_ops import CONVOLUTION_BACKWARD, MATMUL, profiler_names
from .vocabulary import GapClass, Level, Pattern


class TargetOp(BaseModel):
    """One way to realise a pattern on a target, at a ladder level."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    api: str
    level: Level
    note: str = ""


class PatternSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Pattern
    title: str = Field("", description="what the GPU compiler did with it, as an intent's summary says")
    gap_class: GapClass
    level: Level = Field(..., description="the ladder level of the first thing to try")
    eager_ops: tuple[str, ...] = Field(
        (), description="profiler names of the ATen ops the eager form spends its time in on the target")
    removable_share: float = Field(
        0.1, ge=0, le=1, description="share of those ops' time a fused or compiled replacement is expected to remove")
    signature_ops: frozenset[str] = Field(
        frozenset(), description="bare op names whose source lines are the ones to change (an rms norm's rsqrt)")
    target_ops: dict[str, tuple[TargetOp, ...]] = Field(
        default_factory=dict, description="target name -> operators that realise it, first choice first; "
                                          "empty for patterns the GPU compiler does not show (knobs, syncs)")
    graph_signature: str = Field(
        "", description="the dataflow `evidence.graph_match` looks for in a post-grad ATen graph, whatever the "
                        "source's spelling; empty where the pattern is found by other means")


T = TargetOp
_RMS_NOTE = ("eps=None means torch.finfo(dtype).eps, not the program's eps: pass eps explicitly; "
             "normalized_shape is a tuple, e.g. (x.size(-1),)")
_SDPA_NOTE = ("layout (B, heads, T, head_dim); default scale 1/sqrt(head_dim); a bool attn_mask is True where "
              "attention is ALLOWED; is_causal=True together with attn_mask is an error")
_CE_NOTE = ("log_softmax + nll_loss in one op; input [N, C]; weight=None, ignore_index=-100, reduction='mean', "
            "label_smoothing=0.0")
_COMPILE = {"cpu": (T(api="torch.compile(region)", level="L4"),), "cuda": (T(api="torch.compile(region)", level="L4"),)}

_SPECS = (
    PatternSpec(
        name="rms_norm", graph_signature="rsqrt(mean(x*x or x**2) [+ eps]) multiplied back into x",
        title="RMSNorm written out as ATen ops: one fused norm kernel on the GPU",
        gap_class="fusion", level="L2",
        eager_ops=("aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul"), removable_share=0.5,
        signature_ops=frozenset({"rsqrt"}),
        target_ops={
            "npu": (T(api="torch_npu.npu_rms_norm(x, gamma, epsilon)[0]", level="L2",
                      note="fp16/bf16/fp32, gamma same dtype as x; has backward; without a weight pass ones"),
                    T(api="torch.compile(region, backend='npu')", level="L4", note="if the vendor op does not fit")),
            "cpu": (T(api="torch.nn.functional.rms_norm(x, (d,), weight, eps)", level="L2", note=_RMS_NOTE),
                    T(api="torch.compile(region)", level="L4")),
            "cuda": (T(api="torch.nn.functional.rms_norm(x, (d,), weight, eps)", level="L2", note=_RMS_NOTE),
                     T(api="torch.compile(region)", level="L4")),
        }),
    PatternSpec(
        name="add_rms_norm", title="residual add + RMSNorm fused in one GPU kernel",
        gap_class="fusion", level="L2",
        eager_ops=("aten::add", "aten::pow", "aten::mean", "aten::rsqrt", "aten::mul"), removable_share=0.5,
        signature_ops=frozenset({"add2"}),
        target_ops={
            "npu": (T(api="torch_npu.npu_add_rms_norm(x1, x2, gamma, epsilon)", level="L2",
                      note="no backward registered: training needs a custom autograd function (L5) or npu_rms_norm"),
                    T(api="torch_npu.npu_rms_norm(x1 + x2, gamma, epsilon)[0]", level="L2")),
            "cpu": (T(api="torch.nn.functional.rms_norm(x1 + x2, (d,), weight, eps)", level="L2"),
                    T(api="torch.compile(region)", level="L4")),
            "cuda": (T(api="torch.compile(region)", level="L4", note="Inductor fuses the add into the norm"),),
        }),
    PatternSpec(
        name="layer_norm", graph_signature=(
            "rsqrt or sqrt of a variance (var, var_mean, or mean of (x - mean(x)) squared) [+ eps], "
            "applied to the deviations by mul or div"),
        title="LayerNorm fused in one GPU kernel", gap_class="fusion", level="L2",
        eager_ops=("aten::native_layer_norm", "aten::mean", "aten::var", "aten::sub", "aten::add", "aten::sqrt",
                   "aten::rsqrt", "aten::div", "aten::mul", "aten::pow"), removable_share=0.5,
        signature_ops=frozenset({"native_layer_norm", "var_mean", "var", "rsqrt", "sqrt"}),
        target_ops={
            "npu": (T(api="torch.nn.functional.layer_norm (native on NPU)", level="L2"),
                    T(api="torch_npu.npu_add_layer_norm(x1, x2, gamma, beta, eps)", level="L2",
                      note="when a residual add precedes the norm")),
            "cpu": (T(api="torch.nn.functional.layer_norm(x, (d,), weight, bias, eps)", level="L2",
                      note="eps defaults to 1e-05"),),
            "cuda": (T(api="torch.nn.functional.layer_norm(x, (d,), weight, bias, eps)", level="L2",
                       note="eps defaults to 1e-05"),),
        }),
    PatternSpec(
        name="rotary", title="rotary embedding (slice / neg / cat / mul / add) fused in one GPU kernel",
        gap_class="fusion", level="L2",
        eager_ops=("aten::mul", "aten::cat", "aten::neg", "aten::add", "aten::sub", "aten::slice",
                   "aten::view_as_complex", "aten::view_as_real"), removable_share=0.4,
        signature_ops=frozenset({"cat", "neg", "slice", "split", "sub", "view_as_complex"}),
        target_ops={
            "npu": (T(api="torch_npu.npu_rotary_mul(x, cos, sin, rotary_mode='half')", level="L2",
                      note="4-D input (BSND/BNSD), D even and < 896; precompute cos/sin expanded to both halves; "
                           "has backward"),
                    T(api="torch_npu.npu_rotary_mul(x, cos, sin, rotary_mode='interleave')", level="L2",
                      note="complex (view_as_complex) rotary of interleaved pairs: cos/sin each repeated twice")),
            "cpu": (T(api="torch.compile(apply_rotary)", level="L4", note="no native rotary op"),
                    T(api="precompute cos/sin once, rotate with one cat", level="L3")),
            "cuda": (T(api="torch.compile(apply_rotary)", level="L4"),),
        }),
    PatternSpec(
        name="attention", graph_signature=(
            "matrix product (bmm / mm / baddbmm / addmm; einsum and @ arrive as these) -> scale, mask "
            "(where, masked_fill, added tensor), casts, views -> softmax (ATen's or exp / max / sum "
            "written out) -> casts, views, dropout -> matrix product"),
        title="attention scores + mask + softmax fused (or a library attention call)",
        gap_class="fusion", level="L2",
        eager_ops=("aten::bmm", "aten::masked_fill", "aten::_softmax", "aten::_softmax_backward_data",
                   "aten::mul", "aten::div", "aten::where", "aten::clone"), removable_share=0.5,
        signature_ops=frozenset({"_softmax", "softmax", "prepare_softmax_online", "masked_fill", "amax", "where", "exp",
                                 "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                                 "_scaled_dot_product_flash_attention_for_cpu", "scaled_dot_product_attention"}),
        target_ops={
            "npu": (T(api="torch_npu.npu_fusion_attention(q, k, v, head_num, input_layout='BNSD', scale=1/sqrt(d), "
                          "atten_mask=causal_bool_mask, sparse_mode=3)", level="L2",
                      note="atten_mask True = masked out; causal: sparse_mode 2/3 with a 2048x2048 lower-triangular "
                           "mask; output is [0]; D <= 768; skips masked blocks (work domain)"),
                    T(api="torch_npu.npu_scaled_masked_softmax(scores, mask, scale)", level="L2",
                      note="softmax part only; H, W in [32, 4096], multiples of 32")),
            "cpu": (T(api="torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)", level="L2",
                      note=_SDPA_NOTE + "; a flash kernel on CPU"),),
            "cuda": (T(api="torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)", level="L2",
                       note=_SDPA_NOTE + "; flash / memory-efficient kernels"),),
        }),
    PatternSpec(
        name="relu2", title="ReLU² MLP activation fused in one GPU kernel", gap_class="fusion", level="L4",
        eager_ops=("aten::relu", "aten::pow", "aten::threshold_backward", "aten::mul"), removable_share=0.3,
        signature_ops=frozenset({"relu"}),
        target_ops={
            "npu": (T(api="torch.compile(mlp_activation, backend='npu')", level="L4", note="no fused ReLU² op"),
                    T(api="relu(x) * relu(x) via torch_npu custom kernel", level="L6")),
            "cpu": (T(api="torch.compile(mlp_activation)", level="L4"),),
            "cuda": (T(api="torch.compile(mlp_activation)", level="L4"),),
        }),
    PatternSpec(
        name="swiglu", title="SiLU gating fused in one GPU kernel", gap_class="fusion", level="L2",
        eager_ops=("aten::silu", "aten::mul", "aten::silu_backward", "aten::sigmoid", "aten::sigmoid_backward"),
        removable_share=0.3,
        signature_ops=frozenset({"silu", "sigmoid", "exp", "neg", "split", "chunk"}),
        target_ops={
            "npu": (T(api="torch_npu.npu_swiglu(x, dim=-1)", level="L2", note="input is cat([a, b]); has backward"),),
            "cpu": (T(api="torch.nn.functional.silu(a) * b", level="L3", note="one fused activation, not x * sigmoid(x)"),
                    *_COMPILE["cpu"]),
            "cuda": (T(api="torch.nn.functional.silu(a) * b", level="L3", note="one fused activation, not x * sigmoid(x)"),
                     *_COMPILE["cuda"]),
        }),
    PatternSpec(
        name="gelu", graph_signature=(
            "tanh of an input built with 0.044715 (tanh form), or erf of x * 1/sqrt(2) or x / sqrt(2) "
            "(erf form)"),
        title="GELU fused in one GPU kernel", gap_class="fusion", level="L2",
        eager_ops=("aten::gelu", "aten::gelu_backward", "aten::tanh", "aten::tanh_backward", "aten::erf",
                   "aten::pow"), removable_share=0.2,
        signature_ops=frozenset({"gelu", "erf", "tanh"}),
        target_ops={
            "npu": (T(api="torch_npu.npu_gelu(x, approximate='none'|'tanh')", level="L2"),
                    T(api="torch_npu.npu_geglu(x, dim=-1, approximate=1)", level="L2", note="when gelu(a) * b")),
            "cpu": (T(api="torch.nn.functional.gelu(x, approximate='tanh')", level="L2",
                      note="approximate='none' (erf) or 'tanh': keep the program's form"),),
            "cuda": (T(api="torch.nn.functional.gelu(x, approximate='tanh')", level="L2",
                       note="approximate='none' (erf) or 'tanh': keep the program's form"),),
        }),
    PatternSpec(
        name="softcap_cross_entropy", title="tanh softcap + cross-entropy fused on the GPU",
        gap_class="fusion", level="L4",
        eager_ops=("aten::tanh", "aten::tanh_backward", "aten::div", "aten::mul", "aten::_log_softmax",
                   "aten::_log_softmax_backward_data", "aten::nll_loss_forward", "aten::nll_loss_backward"),
        removable_share=0.4,
        signature_ops=frozenset({"tanh", "_log_softmax", "nll_loss_forward", "prepare_softmax_online", "gather", "log"}),
        target_ops={
            "npu": (T(api="torch.compile(softcap + loss, backend='npu')", level="L4"),
                    T(api="torch_npu.npu_cross_entropy_loss(logits.float(), target)[0] after the softcap", level="L2",
                      note="input [N, C]; returns 4 tensors, loss first"),
                    T(api="fused softcap + cross-entropy custom kernel (Triton-Ascend)", level="L6")),
            "cpu": (T(api="torch.compile(softcap + cross_entropy)", level="L4"),),
            "cuda": (T(api="torch.compile(softcap + cross_entropy)", level="L4"),),
        }),
    PatternSpec(
        name="cross_entropy", title="log-softmax + NLL fused on the GPU", gap_class="fusion", level="L2",
        eager_ops=("aten::_log_softmax", "aten::nll_loss_forward"), removable_share=0.2,
        signature_ops=frozenset({"_log_softmax", "nll_loss_forward", "prepare_softmax_online", "gather", "log"}),
        target_ops={
            "npu": (T(api="torch_npu.npu_cross_entropy_loss(logits, target)[0]", level="L2"),),
            "cpu": (T(api="torch.nn.functional.cross_entropy", level="L2", note=_CE_NOTE),),
            "cuda": (T(api="torch.nn.functional.cross_entropy", level="L2", note=_CE_NOTE),),
        }),
    PatternSpec(
        name="optimizer_update", title="optimizer update: per-parameter loop fused by the compiler",
        gap_class="fusion", level="L2",
        eager_ops=("aten::mul_", "aten::add_", "aten::addcmul_", "aten::addcdiv_", "aten::lerp_", "aten::sqrt",
                   "aten::div", "aten::mul", "aten::add", "aten::mm"), removable_share=0.3,
        target_ops={
            "npu": (T(api="torch_npu.optim.NpuFusedAdamW / NpuFusedAdam / NpuFusedSGD", level="L2",
                      note="zero_grad(set_to_none=True) raises; parameters must not be recreated"),
                    T(api="torch.compile(optimizer math, backend='npu')", level="L4",
                      note="custom optimizers (Muon: Newton-Schulz)")),
            "cpu": (T(api="torch.optim.AdamW(..., foreach=True) or fused=True", level="L0",
                      note="fused=True needs floating-point parameters; either replaces the per-parameter loop"),
                    T(api="torch.addcmul / torch.addcdiv / torch.lerp / torch._foreach_*", level="L3",
                      note="fused pointwise maths for a hand-written optimizer"),
                    T(api="torch.compile(optimizer.step)", level="L4")),
            "cuda": (T(api="torch.optim.AdamW(..., fused=True)", level="L0", note="one multi-tensor kernel for the update"),
                     T(api="torch.compile(optimizer.step)", level="L4")),
        }),
    PatternSpec(
        name="precision", title="the GPU program's autocast / dtype, lost in the port",
        gap_class="precision", level="L0",
        eager_ops=tuple(sorted(profiler_names(MATMUL | {"convolution"} | CONVOLUTION_BACKWARD))), removable_share=0.4,
        target_ops={
            "cpu": (T(api="torch.autocast(device_type='cpu', dtype=torch.bfloat16)", level="L0",
                      note="bf16 matmuls on CPU: a precision change, only to restore what the GPU program did"),),
            "cuda": (T(api="torch.autocast(device_type='cuda', dtype=torch.bfloat16)", level="L0",
                       note="torch.backends.cuda.matmul.allow_tf32 is a precision change too: only when the GPU "
                            "program used it"),),
        }),
    PatternSpec(
        name="host_sync", title=".item() / .tolist() / .cpu() / synchronize inside the step",
        gap_class="sync", level="L1",
        eager_ops=("aten::item", "aten::_local_scalar_dense"), removable_share=0.9),
    PatternSpec(
        name="redundant_cast", title="casts and copies with no effect", gap_class="elimination", level="L1",
        eager_ops=("aten::_to_copy", "aten::copy_"), removable_share=0.5),
    PatternSpec(name="threads", title="runtime knobs: threads, allocator, task queue", gap_class="dispatch",
                level="L0", removable_share=0.0),
    PatternSpec(
        name="compile_region", title="selective torch.compile of one region", gap_class="fusion", level="L4",
        removable_share=0.0,
        target_ops={
            "cpu": (T(api="torch.compile(fn, fullgraph=False, dynamic=None, mode=None)", level="L4",
                      note="compile ONE region; the first steps pay compilation (warm-up steps absorb it); graph "
                           "breaks show as extra ops"),),
            "cuda": (T(api="torch.compile(fn, fullgraph=False, dynamic=None, mode=None)", level="L4",
                       note="Inductor/Triton for ONE region"),),
        }),
    PatternSpec(
        name="compile_model", title="torch.compile of the whole model (forward, loss inside it, backward)",
        gap_class="fusion", level="L4", removable_share=0.0,
        target_ops={
            "cpu": (T(api="model.compile(dynamic=False)", level="L4",
                      note="nn.Module.compile: in place, same parameters and state_dict keys; C++ Inductor kernels"),),
            "cuda": (T(api="model.compile(dynamic=False)", level="L4", note="Inductor/Triton for the whole model"),),
            "npu": (T(api='model.compile(backend="npu", dynamic=False)', level="L4",
                      note="torchair's backend, registered by torch_npu"),),
        }),
    PatternSpec(
        name="pointwise_chain", title="chain of elementwise ops fused in one GPU kernel", gap_class="fusion",
        level="L4", eager_ops=("aten::mul", "aten::add", "aten::div", "aten::sub"), removable_share=0.3,
        target_ops={"npu": (T(api="torch.compile(region, backend='npu')", level="L4"),), **_COMPILE}),
    PatternSpec(name="other", title="a fused group with no named pattern", gap_class="fusion", level="L4"),
)

PATTERNS: dict[str, PatternSpec] = {s.name: s for s in _SPECS}
"""Pattern name -> its row."""

UNKNOWN = PatternSpec(name="other", gap_class="fusion", level="L4")
"""What a name missing from the registry reads as: no operators, the default removable share."""


def pattern_spec(name: str) -> PatternSpec:
    """The registry row for a pattern; `UNKNOWN` for a name the registry does not hold."""
    return PATTERNS.get(name, UNKNOWN)
