"""Every timed run of a candidate is checked, not only its validation run.

Validation is one recognisable run; a candidate that behaves only while validated (halves
its batch, skips the backward, when it sees it is being timed) would pass every check there.
So each timed candidate run must show, step by step, the work the incumbent's run of the
same round did (same steps, same work items, as many backward calls), and
its first losses must match the baseline's reference losses by the validation's own rule
(both start from the same seed), and it must run what validation ran (`fingerprint_problem`).
Validation sees only its K steps: a candidate that changes its math from step K + 1 on (a
step counter, a clock) would pass it. So every timed step's loss is also held to the loss of
the same step in the incumbent's run of the same round (same seed, same data, same steps),
by the same rule over all timed steps; for a 16-bit candidate, whose trajectory leaves the
incumbent's step by step, as the means of consecutive windows of validation's K steps
(`correctness.compare_loss_windows`).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from ..harness.models import RunResult, StepRecord
from .correctness import compare_loss_windows, compare_losses

TIMED_PHASES = ("warmup", "measured")


def _timed_steps(r: RunResult) -> list[StepRecord]:
    return sorted((s for s in r.steps if s.phase in TIMED_PHASES), key=lambda s: s.index)


def timed_losses(r: RunResult) -> list[float | None]:
    """The losses of a run's timed steps, in step order: the reference a run of the same round is held to."""
    return [s.loss for s in _timed_steps(r)]


def fingerprint_problem(run: RunResult, validated: RunResult) -> str | None:
    """Whether a timed run ran what validation ran: the program's files as the child hashed them
    before the program started, its arguments and the environment knobs the harness set."""
    a, b = run.environment, validated.environment
    if a is None or b is None:
        return None
    if a.program_sha256 != b.program_sha256:
        return (f"a timed candidate run's program files (sha256 {a.program_sha256[:12]}) are not the ones "
                f"validated ({b.program_sha256[:12]}): the program changed between runs")
    if run.request.args != validated.request.args:
        return f"a timed candidate run's arguments {run.request.args} are not the validated {validated.request.args}"
    if a.env_knobs != b.env_knobs:
        return f"a timed candidate run's environment knobs {a.env_knobs} are not the validated {b.env_knobs}"
    return None


def timed_run_problem(candidate: RunResult, incumbent: RunResult, reference_losses: Sequence[float | None], *,
                      loss_steps: int, rtol_fp32: float, rtol_low_precision: float, low_precision: bool,
                      validated: RunResult | None = None) -> str | None:
    """Why this timed candidate run cannot be believed, or None. `validated` is the candidate's
    validation run, whose fingerprint every timed run must share."""
    if validated is not None and (why := fingerprint_problem(candidate, validated)):
        return why
    cs, js = _timed_steps(candidate), _timed_steps(incumbent)
    if len(cs) != len(js):
        return f"a timed candidate run ran {len(cs)} steps, the incumbent's run of the same round {len(js)}"
    for c, j in zip(cs, js):
        if c.work_items != j.work_items:
            return (f"step {c.index} of a timed candidate run saw {c.work_items} work items, the incumbent's run of "
                    f"the same round {j.work_items}: the candidate does other work when it is timed")
        if c.backward_calls != j.backward_calls:
            return (f"step {c.index} of a timed candidate run called backward {c.backward_calls} times, the "
                    f"incumbent's run of the same round {j.backward_calls}")
    k = min(loss_steps, len(cs), len(reference_losses))
    if k < 1:
        return None
    tol = {"rtol_fp32": rtol_fp32, "rtol_low_precision": rtol_low_precision, "low_precision": low_precision}
    loss = compare_losses(reference_losses, [s.loss for s in cs], steps=k, **tol)
    if not loss.passed:
        return f"a timed candidate run's losses differ from the reference: {loss.reason}"
    incumbent_losses = [s.loss for s in js]
    if len(cs) > k and all(x is not None for x in incumbent_losses):
        if low_precision:  # step by step, a 16-bit trajectory wanders; its window means do not
            every = compare_loss_windows(incumbent_losses, [s.loss for s in cs], window=loss_steps,
                                         rtol=rtol_low_precision)
        else:
            every = compare_losses(incumbent_losses, [s.loss for s in cs], steps=len(cs), **tol)
        if not every.passed:
            return (f"a timed candidate run's losses over all {len(cs)} timed steps differ from the incumbent's "
                    f"run of the same round (validation saw {loss_steps}): {every.reason}")
    return None


def same_round_check(correctness, *, low_precision: bool, incumbent: str = "incumbent",
                     candidate: str = "candidate") -> Callable[[Mapping[str, RunResult]], str | None]:
    """A `timing.interleave` round check for sessions with no reference run of their own
    (`ledger measure`, `ledger verify`): the candidate arm's run is held to the incumbent
    arm's run of the same round, both started from the same seed on the same machine.
    `correctness` is the manifest's correctness section (steps compared, tolerances)."""
    def check(rnd: Mapping[str, RunResult]) -> str | None:
        return timed_run_problem(rnd[candidate], rnd[incumbent], timed_losses(rnd[incumbent]),
                                 loss_steps=correctness.steps, rtol_fp32=correctness.fp32_rtol,
                                 rtol_low_precision=correctness.low_precision_rtol, low_precision=low_precision)
    return check
