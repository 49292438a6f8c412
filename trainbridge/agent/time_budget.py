"""Whether another candidate fits: `--minutes` bounds the whole run, its closing session included.

A user who asks for a 15-minute run should get its report within 15 minutes. Two things
follow the plan node's decision to start a candidate: the candidate itself, which runs to its
decision once started (validation, then up to `looks` timing sessions), and the end-to-end
session that closes every run (port, final and compiled port timed together). So before a
candidate starts, the plan asks whether both still fit in what is left, each estimated from
what this run has already measured on this machine (its ledger's timestamps):

- a candidate: the median of the candidates decided so far (proposed -> decided); before
  the first, one look plus a validation at the baseline's pace;
- one look: the median, over the measured candidates, of (validated -> measured) divided by
  the sessions it took; before the first, `pairs` rounds of two runs at the baseline's pace;
- the end-to-end session: one look scaled from two arms to its three (two without the
  compiled port), plus one run's time for the compiled port's compilation; none in a dry run,
  which times nothing.

The baseline's pace is its node's duration over the process runs it made (the timed ones,
the profile run and the operator-count run). Durations that span a resume are not used: the
gap is the user's, not the run's.
"""

from __future__ import annotations

import statistics
from datetime import datetime

from pydantic import BaseModel, Field

from ..ledger import models as ev

EXTRA_BASELINE_RUNS = 2  # the baseline node's profile run and operator-count run


class TimeEstimate(BaseModel):
    """What the plan node weighs before it starts a candidate, all in working minutes."""

    budget_min: float
    elapsed_min: float
    candidate_min: float = Field(..., description="a candidate, validation to decision")
    end_to_end_min: float = Field(..., description="the closing session of port, final (and compiled port)")
    basis: str = Field(..., description="what the estimates were measured from")

    @property
    def fits_another(self) -> bool:
        return self.elapsed_min + self.candidate_min + self.end_to_end_min <= self.budget_min

    def reason(self) -> str:
        left = max(0.0, self.budget_min - self.elapsed_min)
        return (f"time budget ({self.budget_min:g} min, the end-to-end session included): {left:.1f} min left, a "
                f"candidate takes about {self.candidate_min:.1f} and the closing session about "
                f"{self.end_to_end_min:.1f} ({self.basis})")


def _t(e) -> datetime:
    return datetime.fromisoformat(e.time_utc)


def _minutes(a, b) -> float:
    return (_t(b) - _t(a)).total_seconds() / 60.0


def estimate(events: list, *, budget_min: float, elapsed_min: float, pairs: int, baseline_runs: int,
             with_compile: bool, end_to_end: bool = True) -> TimeEstimate:
    """The estimate from the run's ledger so far (events in the order they were logged)."""
    session = 0  # a resume starts a new working session: no duration is measured across one
    opened: dict[str, tuple[int, object]] = {}
    validated: dict[str, tuple[int, object]] = {}
    candidates, looks = [], []
    start = baseline = None
    for e in events:
        if isinstance(e, ev.RunResumed):
            session += 1
        elif isinstance(e, (ev.RunStarted, ev.PortApplied)):
            start = (session, e)
        elif isinstance(e, ev.BaselineMeasured) and start is not None and start[0] == session:
            baseline = _minutes(start[1], e)
        elif isinstance(e, ev.CandidateProposed):
            opened[e.candidate_id] = (session, e)
        elif isinstance(e, ev.CandidateValidated):
            validated[e.candidate_id] = (session, e)
        elif isinstance(e, ev.CandidateMeasured) and validated.get(e.candidate_id, (None,))[0] == session:
            n_looks = max(1, -(-len(e.incumbent_runs_ms) // max(1, pairs)))
            looks.append(_minutes(validated[e.candidate_id][1], e) / n_looks)
        elif isinstance(e, ev.CandidateDecided) and opened.get(e.candidate_id, (None,))[0] == session:
            candidates.append(_minutes(opened[e.candidate_id][1], e))
    run_min = baseline / (baseline_runs + EXTRA_BASELINE_RUNS) if baseline else 0.0
    look = statistics.median(looks) if looks else 2 * pairs * run_min
    candidate = statistics.median(candidates) if candidates else look + 2 * run_min
    arms = 3 if with_compile else 2
    closing = look * arms / 2 + (run_min if with_compile else 0.0) if end_to_end else 0.0
    basis = (f"{len(candidates)} decided candidates, {len(looks)} measured" if candidates or looks
             else "the baseline's pace" if baseline else "nothing measured yet")
    return TimeEstimate(budget_min=budget_min, elapsed_min=elapsed_min, candidate_min=candidate,
                        end_to_end_min=closing, basis=basis)
