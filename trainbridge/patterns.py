"""Names of the optimization patterns shared by evidence, planner and rewriters.

An intent names the pattern it found on the GPU; a recipe names the patterns it realises.
Keeping the vocabulary in one place is what lets the planner join the two.
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
    "pointwise_chain",   # other fused elementwise groups
    "other",
]

GapClass = Literal[
    "porting_artifact", "elimination", "fusion", "work_domain", "sparsity", "precision",
    "layout", "reuse", "dispatch", "sync", "communication", "memory_lifetime",
    "compiler_boundary",
]

Level = Literal["L0", "L1", "L2", "L3", "L4", "L5", "L6"]
