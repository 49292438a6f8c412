"""Where the step time goes: computing / uncovered communication / free, and kernel time by engine."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from .models import KernelRow, KernelTime, StepBreakdown, StepTraceRow


def _breakdown(source, steps: int, comp: float, comm: float, free: float) -> StepBreakdown:
    total = comp + comm + free
    sh = (lambda x: x / total) if total > 0 else (lambda x: 0.0)
    return StepBreakdown(source=source, steps=steps, step_us=total / steps, computing_us=comp / steps,
                         communication_us=comm / steps, free_us=free / steps, computing_share=sh(comp),
                         communication_share=sh(comm), free_share=sh(free))


def step_breakdown(rows: list[StepTraceRow]) -> StepBreakdown | None:
    """Mean computing / uncovered communication / free per step from step_trace_time.csv."""
    if not rows:
        return None
    return _breakdown("step_trace_time.csv", len(rows), sum(r.computing_us for r in rows),
                      sum(r.communication_not_overlapped_us for r in rows), sum(r.free_us for r in rows))


def _union(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def kernel_breakdown(kernels: list[KernelRow]) -> StepBreakdown | None:
    """The same split from kernel timestamps when step_trace_time.csv is absent.

    Per step (Step Id, else the whole profile): free = span - union(all kernels); computing =
    union(compute kernels); communication = union(all) - union(compute) (the uncovered part).
    """
    if not kernels:
        return None
    groups: dict[int | None, list[KernelRow]] = defaultdict(list)
    for k in kernels:
        groups[k.step_id].append(k)
    comp = comm = free = 0.0
    for ks in groups.values():
        span = max(k.start_us + k.duration_us for k in ks) - min(k.start_us for k in ks)
        busy = _union((k.start_us, k.start_us + k.duration_us) for k in ks)
        c = _union((k.start_us, k.start_us + k.duration_us) for k in ks if k.category != "communication")
        comp, comm, free = comp + c, comm + (busy - c), free + (span - busy)
    return _breakdown("kernel_details.csv", len(groups), comp, comm, free)


def kernel_time(kernels: list[KernelRow]) -> KernelTime | None:
    if not kernels:
        return None
    by = defaultdict(float)
    for k in kernels:
        by[k.category] += k.duration_us
    computing = by["cube"] + by["vector"] + by["aicpu"]
    sh = (lambda x: x / computing) if computing > 0 else (lambda x: 0.0)
    return KernelTime(total_us=computing + by["communication"], cube_us=by["cube"], vector_us=by["vector"],
                      aicpu_us=by["aicpu"], communication_us=by["communication"], cube_share=sh(by["cube"]),
                      vector_share=sh(by["vector"]), aicpu_share=sh(by["aicpu"]), kernels=len(kernels))
