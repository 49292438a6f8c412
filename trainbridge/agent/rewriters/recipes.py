"""The offline recipe library: one mechanism per recipe, as libcst rewrites.

Recipes match the *shape* of the code (expressions resolved through local assignments, see
`pysource.scope.Scope`), not any program's text, so they apply to the same idiom written
differently: `x.pow(2)` / `x * x` / `x ** 2` / `torch.square(x)`, `torch.rsqrt(v)` /
`1 / torch.sqrt(v)`, `mean(-1, keepdim=True)` / `mean(dim=-1, keepdim=True)`, method or
function, chained or split statements.

Public API
----------
`Recipe` (name, pattern, level, gap_class, targets, mechanism; `find(files, target)` ->
[`Site`], `apply(files, target, sites=None)` -> `RewriteProposal` | `NotApplicable`),
`RECIPES` (name -> Recipe), `recipes_for(pattern, target)`.

Each family lives in its own module (`recipes_runtime`, `recipes_norm`, `recipes_rotary`,
`recipes_rotary_complex`, `recipes_attention`, `recipes_mlp`, `recipes_glu`, `recipes_optim`, `recipes_sync`, `recipes_compile`,
`recipes_compile_model`);
their docstrings give the recognised forms, the math, the measurements behind the choices
and the caveats.
"""

from __future__ import annotations

from ...patterns import level_rank
from ...targets.registry import TARGET_NAMES
from .recipe_base import NotApplicable, Recipe, RewriteProposal, Site
from .recipes_attention import AttentionRecipe
from .recipes_compile import CompileRegionRecipe, SoftcapCrossEntropyRecipe
from .recipes_compile_model import CompileModelRecipe
from .recipes_gelu import GeluRecipe
from .recipes_glu import GatedUnitRecipe
from .recipes_layer_norm import LayerNormRecipe
from .recipes_mlp import Relu2Recipe
from .recipes_norm import RmsNormRecipe
from .recipes_optim import FusedOptimizerRecipe
from .recipes_precision import Fp32WhereBf16IsSlowRecipe
from .recipes_rotary import RotaryRecipe
from .recipes_rotary_complex import ComplexRotaryRecipe
from .recipes_runtime import (
    AutocastRecipe,
    EnvKnobRecipe,
    StatementKnobRecipe,
    ThreadsRecipe,
)
from .recipes_sync import HostSyncRecipe

__all__ = ["NotApplicable", "Recipe", "RewriteProposal", "Site", "RECIPES", "recipes_for"]

_ALL = set(TARGET_NAMES)
_CPU_SYNC = "a CPU runs each operator synchronously: a host read costs a scalar copy, there is no queue to drain"
_CUDA_AS_IS = ("the cuda port keeps the GPU program as written (its torch.compile included): nothing of the "
               "GPU's own to restore")

RECIPES: dict[str, Recipe] = {r.name: r for r in [
    ThreadsRecipe(
        "threads_knob", "threads", "L0", "dispatch", {"cpu", "npu"},
        "set the host threading of the runtime: intra-op threads = available physical cores (cpu); "
        "TASK_QUEUE_ENABLE=2 + CPU_AFFINITY_CONF=1 launch pipeline (npu)",
        unsupported={"cuda": _CUDA_AS_IS}),
    EnvKnobRecipe(
        "npu_alloc_conf", "threads", "L0", "memory_lifetime", {"npu"},
        "use the npu caching allocator's expandable segments (PYTORCH_NPU_ALLOC_CONF)",
        var="PYTORCH_NPU_ALLOC_CONF", value="expandable_segments:True", why="less fragmentation (reserved >> allocated)",
        unsupported={"cpu": "no device allocator", "cuda": "npu-only knob"}),
    StatementKnobRecipe(
        "npu_jit_compile_off", "threads", "L0", "dispatch", {"npu"},
        "run binary npu kernels instead of compiling operators online (jit_compile=False)",
        line="torch_npu.npu.set_compile_mode(jit_compile=False)  # trainbridge: binary kernels, no online op compile",
        marker="set_compile_mode", unsupported={"cpu": "npu-only knob", "cuda": "npu-only knob"}),
    StatementKnobRecipe(
        "npu_hf32", "precision", "L0", "precision", {"npu"},
        "let npu matmuls use HF32 (torch.npu.matmul.allow_hf32 = True)",
        line="torch.npu.matmul.allow_hf32 = True  # trainbridge: HF32 matmuls (a precision change: loss checked)",
        marker="allow_hf32", unsupported={"cpu": "npu-only knob", "cuda": "npu-only knob (cuda's TF32 is another knob)"},
        notes=["HF32 lowers fp32 matmul precision: the low-precision loss tolerance applies"]),
    AutocastRecipe(
        "autocast_reapply", "precision", "L0", "porting_artifact", set(_ALL),
        "point the program's 16-bit autocast at the target device (the port left it on another device, a no-op)",
        gemm_precision="lower"),
    Fp32WhereBf16IsSlowRecipe(
        "fp32_where_bf16_slow", "precision", "L0", "porting_artifact", {"cpu"},
        "run one function's explicit bf16 casts and bf16 buffers in fp32 on a target without bf16 math units",
        per_site=True, unsupported={"cuda": "bf16 is native on the GPUs the programs target",
                                    "npu": "bf16 is native on Atlas A2 (910B); 910A is not a supported target"},
        ops_removed=["aten::_to_copy"], gemm_precision="higher"),
    RmsNormRecipe(
        "rms_norm_fused", "rms_norm", "L2", "fusion", set(_ALL),
        "replace a hand-written RMSNorm by the fused RMSNorm operator (F.rms_norm / npu_rms_norm)",
        ops_removed=["aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul"]),
    RotaryRecipe(
        "rotary_fused", "rotary", "L2", "fusion", set(_ALL),
        "compute half-split rotary embeddings in one pass (npu_rotary_mul on npu; one roll + multiply-add "
        "instead of slices, four multiplies and a cat on cpu/cuda)",
        levels={"cpu": "L3", "cuda": "L3"},
        ops_removed=["aten::slice", "aten::mul", "aten::mul", "aten::add", "aten::neg", "aten::cat"]),
    ComplexRotaryRecipe(
        "rotary_complex_fused", "rotary", "L2", "fusion", {"npu"},
        "compute complex-number rotary embeddings (view_as_complex(x) * freqs) as npu_rotary_mul in its "
        "'interleave' mode",
        unsupported={"cpu": "the complex product is one kernel between two free views: nothing to fuse",
                     "cuda": "the complex product is one kernel between two free views: nothing to fuse"},
        ops_removed=["aten::mul", "aten::view_as_complex", "aten::view_as_real"]),
    AttentionRecipe(
        "sdpa_attention", "attention", "L2", "fusion", set(_ALL),
        "replace hand-written softmax attention (causal, masked or full) by the fused attention operator "
        "(SDPA / npu_fusion_attention)",
        ops_removed=["aten::bmm", "aten::mul", "aten::masked_fill", "aten::_softmax", "aten::bmm"]),
    Relu2Recipe(
        "relu2_fused", "relu2", "L5", "fusion", set(_ALL),
        "compute relu(x)^2 as a custom autograd function whose backward is one multiply (no threshold_backward)",
        ops_removed=["aten::threshold_backward"]),
    LayerNormRecipe(
        "layer_norm_fused", "layer_norm", "L2", "fusion", set(_ALL),
        "replace a hand-written LayerNorm (recognised by its values: any spelling of mean, variance, eps, "
        "weight and bias over the last dimension) by the fused LayerNorm operator (F.layer_norm)",
        ops_removed=["aten::mean", "aten::var", "aten::sub", "aten::sqrt", "aten::rsqrt", "aten::div"]),
    GeluRecipe(
        "gelu_fused", "gelu", "L2", "fusion", set(_ALL),
        "replace a hand-written GELU (tanh or erf form, recognised by its values) by the fused GELU operator "
        "(F.gelu / npu_gelu)",
        ops_removed=["aten::tanh", "aten::erf", "aten::pow"]),
    GatedUnitRecipe(
        "swiglu_fused", "swiglu", "L2", "fusion", set(_ALL),
        "compute a SiLU-gated unit silu(a) * b as the fused operator (npu_swiglu on npu; a hand-written SiLU "
        "as F.silu on cpu/cuda, where torch has no fused gated unit)",
        levels={"cpu": "L3", "cuda": "L3"}, activation="silu",
        ops_removed=["aten::sigmoid", "aten::silu", "aten::mul", "aten::sigmoid_backward", "aten::silu_backward"]),
    GatedUnitRecipe(
        "geglu_fused", "gelu", "L2", "fusion", {"npu"},
        "compute a GELU-gated unit gelu(a) * b as the fused operator (npu_geglu)", activation="gelu",
        unsupported={"cpu": "torch has no fused GELU-gated unit (gelu_fused fuses a hand-written GELU)",
                     "cuda": "torch has no fused GELU-gated unit (gelu_fused fuses a hand-written GELU)"},
        ops_removed=["aten::gelu", "aten::gelu_backward"]),
    FusedOptimizerRecipe(
        "fused_optimizer", "optimizer_update", "L2", "fusion", set(_ALL),
        "update all parameters of a torch.optim Adam/AdamW/SGD in one fused kernel (fused=True / NpuFused*)",
        ops_removed=["aten::mul_", "aten::add_", "aten::addcmul_", "aten::addcdiv_", "aten::lerp_", "aten::sqrt"]),
    HostSyncRecipe(
        "remove_host_sync", "host_sync", "L1", "sync", {"npu", "cuda"},
        "read logged device values (.item()) only on logging steps, not every step",
        unsupported={"cpu": _CPU_SYNC}, ops_removed=["aten::item", "aten::_local_scalar_dense"]),
    CompileRegionRecipe(
        "compile_region", "compile_region", "L4", "fusion", set(_ALL),
        "torch.compile exactly one function (one supernode's source region)", per_site=True,
        dry_run_checkable=False, compiled_on=set(_ALL)),  # backend="npu" (torchair) does not exist on the CPU
    CompileModelRecipe(
        "compile_model", "compile_model", "L4", "fusion", set(_ALL),
        "torch.compile the whole model in place (nn.Module.compile): forward, the loss inside it, and backward",
        dry_run_checkable=False, compiled_on=set(_ALL)),  # backend="npu" (torchair) does not exist on the CPU
    SoftcapCrossEntropyRecipe(
        "softcap_ce_fused", "softcap_cross_entropy", "L4", "fusion", set(_ALL),
        "fuse the tanh logit softcap with the cross-entropy (one compiled region on cpu/cuda; "
        "npu_cross_entropy_loss on npu)",
        levels={"npu": "L2"}, compiled_on={"cpu", "cuda"},
        ops_removed=["aten::tanh", "aten::div", "aten::mul", "aten::_to_copy", "aten::_log_softmax",
                     "aten::nll_loss_forward"]),
]}


def recipes_for(pattern: str, target: str) -> list[Recipe]:
    """Recipes that realise `pattern` on `target` (cheapest ladder level first)."""
    out = [r for r in RECIPES.values() if r.pattern == pattern and target in r.targets]
    return sorted(out, key=lambda r: level_rank(r.level_for(target)))
