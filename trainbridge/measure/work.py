"""Work conservation: a faster candidate must still do the baseline's work.

Skipped work is the most common way automated optimizers fool themselves (smaller batch,
fewer layers, an early return). Two independent counts catch it: the work items the root
module sees per step (tokens or samples) and the FLOPs of one step
(torch.utils.flop_counter). FLOPs may rise (recomputation); they may not fall.
"""

from __future__ import annotations

from pydantic import BaseModel

from ..harness.models import RunResult


class WorkVerdict(BaseModel):
    passed: bool
    reason: str
    baseline_flops: int | None = None
    candidate_flops: int | None = None


def check_work(baseline: RunResult, candidate: RunResult, *, flop_rtol: float = 0.01) -> WorkVerdict:
    if len(candidate.steps) != len(baseline.steps):
        return WorkVerdict(passed=False, reason=f"{len(candidate.steps)} steps vs the baseline's {len(baseline.steps)}")
    for b, c in zip(baseline.steps, candidate.steps):
        if b.work_items != c.work_items:
            return WorkVerdict(passed=False, reason=(
                f"step {c.index}: {c.work_items} work items (tokens/samples) vs the baseline's {b.work_items}"))
        if b.work_items == 0:
            return WorkVerdict(passed=False, reason=f"step {b.index}: no work items observed; cannot check work")
    bf, cf = baseline.flops_per_step, candidate.flops_per_step
    if bf is None or cf is None:
        side = "baseline" if bf is None else "candidate"
        return WorkVerdict(passed=False, reason=f"no FLOP count for the {side}", baseline_flops=bf, candidate_flops=cf)
    if cf < bf * (1 - flop_rtol):
        return WorkVerdict(passed=False, baseline_flops=bf, candidate_flops=cf, reason=(
            f"FLOPs per step fell {100 * (1 - cf / bf):.1f}% ({bf:,} -> {cf:,}): work was skipped"))
    return WorkVerdict(passed=True, baseline_flops=bf, candidate_flops=cf,
                       reason=f"work items equal on every step; FLOPs {bf:,} -> {cf:,}")
