"""The words every stage uses for an optimization: its pattern, its gap class, its ladder level.

An intent names the pattern it found on the GPU; a recipe names the patterns it realises;
the planner joins the two. Level costs live here too, so ranking and reporting agree.
"""

from typing import Literal

Pattern = Literal[
    "rms_norm",          # x * rsqrt(mean(x^2) + eps) [* w]
    "add_rms_norm",      # residual add followed by rms norm
    "layer_norm",
    "rotary",            # x*cos + rotate_half(x)*sin
    "attention",         # matmul, scale, mask, softmax, matmul (or SDPA already)
    "relu2",             # relu(x).square()
    "swiglu",            # silu(a) * b
    "gelu",
    "softcap_cross_entropy",  # c*tanh(logits/c) + cross entropy
    "cross_entropy",
    "optimizer_update",  # per-parameter optimizer loops (AdamW, SGD, Muon math)
    "precision",         # autocast / dtype the port lost
    "host_sync",         # .item(), .tolist(), .cpu(), synchronize in the step
    "redundant_cast",    # casts/copies with no effect
    "threads",           # L0 runtime knobs: threads, allocator, task queue
    "compile_region",    # selective torch.compile of one region
    "compile_model",     # torch.compile of the whole model (forward, loss inside it, backward)
    "pointwise_chain",   # other fused elementwise groups
    "other",
]

GapClass = Literal[
    "porting_artifact", "elimination", "fusion", "work_domain", "sparsity", "precision",
    "layout", "reuse", "dispatch", "sync", "communication", "memory_lifetime",
    "compiler_boundary",
]

Level = Literal["L0", "L1", "L2", "L3", "L4", "L5", "L6"]

LEVELS: tuple[Level, ...] = ("L0", "L1", "L2", "L3", "L4", "L5", "L6")
"""The optimization ladder, cheapest first: L0 knobs, L1 removed syncs/casts, L2 a vendor's fused
operator, L3 a rewrite in plain torch, L4 selective compilation, L5 a custom autograd
function, L6 a custom kernel."""

LEVEL_COST: dict[Level, float] = {"L0": 1.0, "L1": 1.2, "L2": 1.5, "L3": 2.0, "L4": 2.5, "L5": 4.0, "L6": 8.0}
"""What climbing to a level costs (risk, code to review): the planner divides a predicted saving by it."""


def level_rank(level: str) -> int:
    """0 for L0 ... 6 for L6; an unknown level sorts after all of them."""
    return LEVELS.index(level) if level in LEVELS else len(LEVELS)  # type: ignore[arg-type]
