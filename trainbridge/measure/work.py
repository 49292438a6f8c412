"""Work conservation: a faster candidate must still do the baseline's work.

Skipped work is the most common way automated optimizers fool themselves (smaller batch,
shorter sequence, fewer layers, fewer steps, an early return). Independent counts catch it:
the number of steps the harness saw, the work items (tokens or samples) the root module saw
on each of them, the backward calls of each (the loss recorded is the last one's tensor, so
an added backward could forge it), the FLOPs of one step (torch.utils.flop_counter), and the
elementwise work of that step (harness.elementwise: the arithmetic FLOPs leave out, with
fused ops counted as what they decompose into). Both may rise (recomputation is a legitimate
trade); FLOPs may not fall beyond `flop_rtol`, elementwise work not beyond `elementwise_rtol`.
The elementwise tolerance is wide because two correct spellings of one region differ (torch's
LayerNorm decomposition counts a fifth less than a hand-written one): it catches deletions that
are a real share of the step (a softcap on a large vocabulary), while small near-identity ops
are the later-window loss check's to catch.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..harness.models import RunResult, StepRecord

# Phases whose work items are compared step by step: the timed ones, and the step the FLOPs
# were counted on (its work must match too, or the FLOP comparison compares different work).
_COMPARED = ("warmup", "measured", "count_flops")


class WorkVerdict(BaseModel):
    passed: bool
    reason: str
    warmup_steps_baseline: int = 0
    measured_steps_baseline: int = 0
    warmup_steps_candidate: int = 0
    measured_steps_candidate: int = 0
    work_items_baseline: int = Field(0, description="sum over compared steps")
    work_items_candidate: int = 0
    first_mismatch_step: int | None = Field(None, description="1-based step index where work items first differ")
    baseline_flops: int | None = Field(None, description="FLOPs per step")
    candidate_flops: int | None = None
    flops_ratio: float | None = Field(None, description="candidate / baseline FLOPs per step; > 1 is allowed")
    baseline_elementwise: int | None = Field(None, description="elementwise work per step (elements)")
    candidate_elementwise: int | None = None
    elementwise_ratio: float | None = Field(None, description="candidate / baseline elementwise work per step")
    notes: list[str] = Field(default_factory=list, description="differences recorded but not failed on")


def _steps(r: RunResult, phase: str) -> list[StepRecord]:
    return sorted((s for s in r.steps if s.phase == phase), key=lambda s: s.index)


ELEMENTWISE_RTOL = 0.10


def _largest_falls(baseline: dict[str, int], candidate: dict[str, int], n: int = 3) -> str:
    falls = sorted(((b - candidate.get(op, 0), op, b) for op, b in baseline.items()), reverse=True)
    return ", ".join(f"{op} {b:,} -> {candidate.get(op, 0):,}" for d, op, b in falls[:n] if d > 0)


def check_work(baseline: RunResult, candidate: RunResult, *, flop_rtol: float = 0.01,
               elementwise_rtol: float = ELEMENTWISE_RTOL) -> WorkVerdict:
    """Fail when the candidate ran fewer/more steps, saw other work items, or does fewer FLOPs."""
    bw, bm = _steps(baseline, "warmup"), _steps(baseline, "measured")
    cw, cm = _steps(candidate, "warmup"), _steps(candidate, "measured")
    counts = {"warmup_steps_baseline": len(bw), "measured_steps_baseline": len(bm),
              "warmup_steps_candidate": len(cw), "measured_steps_candidate": len(cm)}
    b_cmp = [s for p in _COMPARED for s in _steps(baseline, p)]
    c_cmp = [s for p in _COMPARED for s in _steps(candidate, p)]
    items = {"work_items_baseline": sum(s.work_items for s in b_cmp),
             "work_items_candidate": sum(s.work_items for s in c_cmp)}
    bf, cf = baseline.flops_per_step, candidate.flops_per_step
    flops = {"baseline_flops": bf, "candidate_flops": cf}

    def fail(reason: str, **kw) -> WorkVerdict:
        return WorkVerdict(passed=False, reason=reason, **counts, **items, **flops, **kw)

    if not bm:
        return fail("baseline has no measured steps: nothing to compare the candidate's work against")
    if (len(cw), len(cm)) != (len(bw), len(bm)):
        return fail(f"candidate ran {len(cw)} warmup + {len(cm)} measured steps, "
                    f"baseline {len(bw)} + {len(bm)}")
    if len(c_cmp) != len(b_cmp):
        return fail(f"candidate has {len(c_cmp)} compared steps (with the FLOP-count step), baseline {len(b_cmp)}")
    if all(s.work_items == 0 for s in b_cmp):
        return fail("baseline work_items missing (0 on every step): cannot check the work done")
    if all(s.work_items == 0 for s in c_cmp):
        return fail("candidate work_items missing (0 on every step): the root module saw no inputs")
    notes: list[str] = []
    for b, c in zip(b_cmp, c_cmp):
        if b.work_items != c.work_items:
            return fail(f"step {c.index} ({c.phase}): candidate saw {c.work_items} work items, baseline "
                        f"{b.work_items} ({c.work_items / max(b.work_items, 1):.2f}x)", first_mismatch_step=c.index)
        if b.backward_calls > 0 and c.backward_calls == 0:
            return fail(f"step {c.index} ({c.phase}): candidate called backward 0 times, baseline "
                        f"{b.backward_calls}: the step skips the backward pass", first_mismatch_step=c.index)
        if b.backward_calls != c.backward_calls:
            # the recorded loss is the tensor of the step's last backward: one more can forge it
            return fail(f"step {c.index} ({c.phase}): candidate called backward {c.backward_calls} times, baseline "
                        f"{b.backward_calls}", first_mismatch_step=c.index)
    if bf is None:
        return fail("baseline flops_per_step missing (run it with count_flops_step)")
    if cf is None:
        return fail("candidate flops_per_step missing (run it with count_flops_step)")
    if bf <= 0:
        return fail(f"baseline flops_per_step is {bf}: the FLOP counter saw no work")
    ratio = cf / bf
    if ratio < 1.0 - flop_rtol:
        return fail(f"FLOPs per step fell {100 * (1 - ratio):.1f}% ({bf:,} -> {cf:,}), more than "
                    f"{100 * flop_rtol:g}%: work was skipped", flops_ratio=ratio)
    if ratio > 1.0:
        notes.append(f"FLOPs per step rose {100 * (ratio - 1):.1f}% (recomputation?)")
    be, ce = baseline.elementwise_per_step, candidate.elementwise_per_step
    elem: dict = {}
    elem_text = ""
    if be is None or ce is None or be.total <= 0:
        notes.append("elementwise work not compared: " + ("the baseline" if be is None or be.total <= 0
                                                           else "the candidate") + " has no count")
    else:
        eratio = ce.total / be.total
        elem = {"baseline_elementwise": be.total, "candidate_elementwise": ce.total, "elementwise_ratio": eratio}
        elem_text = f", elementwise work {be.total:,} -> {ce.total:,}"
        if eratio < 1.0 - elementwise_rtol:
            what = (f"elementwise work per step fell {100 * (1 - eratio):.1f}% ({be.total:,} -> {ce.total:,}), "
                    f"more than {100 * elementwise_rtol:g}%; largest falls: {_largest_falls(be.by_op, ce.by_op)}")
            unseen = sorted(set(ce.opaque) - set(be.opaque))
            if not unseen:
                return fail(what + ": work was deleted", flops_ratio=ratio, **elem)
            notes.append(f"{what}, but the candidate calls {', '.join(unseen)}, whose work the counter cannot "
                         "see: not decisive")
    return WorkVerdict(passed=True, **counts, **items, **flops, **elem, flops_ratio=ratio, notes=notes,
                       reason=(f"{len(bw)}+{len(bm)} steps, work items equal on every step "
                               f"({items['work_items_baseline']:,} total), FLOPs per step {bf:,} -> {cf:,}"
                               + elem_text))
