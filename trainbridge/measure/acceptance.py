"""The keep/reject policy, in one place: the loop, the final report and `ledger verify` all
judge with these rules and the same bar.

- **The bar.** A candidate is kept when the lower end of its speedup interval clears
  `1 + min_effect`. The configured `min_effect` is checked against A/A splits of the
  baseline's own runs; where the rule would take the program for faster than itself more
  often than allowed, the bar is raised to what those splits need (rounded up to 0.5%), and
  that raised bar is the run's bar for everything after: decisions, the end-to-end figure,
  re-verification.
- **More pairs where undecided, under a computed error rate.** A candidate whose interval
  straddles the bar, with its point estimate at least half-way there, is timed again (one
  more session of pairs) up to `looks` sessions, and each look is judged at the level a
  group-sequential plan gives it (`measure.sequential`): the false-accept rate over all
  looks is the one-sided rate of a single look at the configured confidence, computed for
  the plan's pair counts. A gain above 3x from one change (suspicious) is always looked at
  a second time.
- **Repairs.** A candidate a model wrote and that failed validation or timing goes back to
  the model with the exact failure, at most `MAX_LOOP_REPAIRS` times; inside one request the
  model's answer may be sent back `MAX_ANSWER_REPAIRS` times when it does not apply.
- **Every timed run counts.** A candidate's timed runs must do the incumbent's work step by
  step and reproduce the reference losses (`measure.timed_runs`); one that does not is
  rejected, whatever its timing.
- **Re-verification.** A recorded end-to-end figure holds when at least `MIN_VERIFY_PAIRS`
  rounds ran, today's interval still clears "no change", and the recorded figure lies
  within `VERIFY_DRIFT` of that interval.

Each decision names its rule (`Rule`) in the ledger.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Callable

from . import sequential
from .sequential import Spending
from .statistics import AACalibration, Comparison, Runs, calibrate_aa, compare

BAR_STEP = 0.005            # a raised bar is rounded up to a multiple of 0.5%
MAX_LOOP_REPAIRS = 2        # validation/timing failures sent back to the model, per candidate
MAX_ANSWER_REPAIRS = 2      # unusable answers sent back within one model request
VERIFY_DRIFT = 0.05         # a re-verified figure may lie this far outside today's interval
MIN_VERIFY_PAIRS = 3        # fewer rounds cannot show run-to-run noise: verify refuses them


class Rule(str, Enum):
    """Why a candidate was kept or not: each decision in the ledger names one."""

    INTERVAL_CLEARS_BAR = "interval_clears_bar"          # accepted: CI low > 1 + bar
    INTERVAL_BELOW_BAR = "interval_below_bar"            # rejected by the timing
    FAILED_VALIDATION = "failed_validation"              # parse, guard, run, loss, work or mechanism
    TIMING_RUNS_FAILED = "timing_runs_failed"            # no complete interleaved round
    TIMED_RUN_MISMATCH = "timed_run_mismatch"            # a timed run did other work than validation saw
    REWRITER_DECLINED = "rewriter_declined"              # no program to judge
    DRY_RUN_VALIDATED = "dry_run_validated"              # references only: kept, never a speedup


# ---------------------------------------------------------------------- bar ----
def raised_bar(min_effect_needed: float) -> float:
    """The A/A splits' need, rounded up to a multiple of `BAR_STEP` (a need of exactly a multiple
    still moves up one step: the rule has always rounded that way, and decisions must not change)."""
    steps_per_unit = round(1 / BAR_STEP)
    return math.ceil(min_effect_needed * steps_per_unit + 1e-9) / steps_per_unit


def calibrated_bar(runs: Runs, *, min_effect: float, confidence: float, max_false_accept_rate: float,
                   ) -> tuple[AACalibration, float]:
    """The A/A check of the configured bar on the baseline's runs, and the bar the run will use.

    Returns the calibration of the bar actually used (re-run at the raised bar if raised).
    """
    aa = calibrate_aa(runs, min_effect=min_effect, confidence=confidence, target_rate=max_false_accept_rate)
    if aa.false_accept_rate <= max_false_accept_rate:
        return aa, min_effect
    bar = max(min_effect, raised_bar(aa.min_effect_needed))
    return calibrate_aa(runs, min_effect=bar, confidence=confidence, target_rate=max_false_accept_rate), bar


def run_bar(events, configured: float) -> float:
    """The bar a recorded run decided with: its baseline's (possibly raised) one, else the configured."""
    from ..ledger import models as ev  # the ledger's event types; measure does not depend on the ledger otherwise

    bars = [e.min_effect for e in events if isinstance(e, ev.BaselineMeasured) and e.min_effect is not None]
    return bars[-1] if bars else configured


# ---------------------------------------------------------------- decisions ----
def judge(incumbent_runs: Runs, candidate_runs: Runs, *, bar: float, confidence: float) -> Comparison:
    """Incumbent against candidate at the run's bar."""
    return compare(incumbent_runs, candidate_runs, min_effect=bar, confidence=confidence)


def judge_sequentially(first: tuple[Runs, Runs], time_more: Callable[[], tuple[Runs, Runs]], *, bar: float,
                       confidence: float, looks: int, pairs_per_look: int,
                       spending: Spending = "pocock") -> tuple[Runs, Runs, Comparison, str]:
    """Judge the first session at the plan's first level; while the result is undecided (or
    suspicious) and looks remain, time one more session and judge all pairs at the next level.

    Returns (incumbent runs, candidate runs, the last look's comparison, a note naming the look
    and the plan's levels).
    """
    p = sequential.plan(looks, confidence, max(2, pairs_per_look), spending)
    inc, cand = list(first[0]), list(first[1])
    for look in range(1, looks + 1):
        comp = judge(inc, cand, bar=bar, confidence=p.confidence_at(look))
        undecided = comp.decision == "reject" and sequential.keep_looking(comp.speedup, comp.ci_low, comp.ci_high, bar)
        if look == looks or not ((comp.suspicious and look == 1) or undecided):
            break
        more_inc, more_cand = time_more()
        inc, cand = inc + list(more_inc), cand + list(more_cand)
    why = " (suspicious gain: looked at again)" if comp.suspicious and look > 1 else ""
    return inc, cand, comp, p.describe(look) + why


def rule_of(comp: Comparison) -> Rule:
    return Rule.INTERVAL_CLEARS_BAR if comp.decision == "accept" else Rule.INTERVAL_BELOW_BAR


def may_repair(source: str, repairs_done: int, rewriter_repairs: bool) -> bool:
    """A model's candidate goes back to the model while its repair budget lasts; a recipe's never
    (the same recipe would write the same program again)."""
    return source.startswith("llm:") and rewriter_repairs and repairs_done < MAX_LOOP_REPAIRS


def verify_holds(recorded: float | None, comp: Comparison) -> bool:
    """A recorded end-to-end speedup holds when today's interval clears 1 and lies, within
    `VERIFY_DRIFT` (machine state drifts between sessions), around the recorded figure."""
    return bool(recorded is not None and comp.n_runs_incumbent >= MIN_VERIFY_PAIRS and comp.ci_low > 1.0
                and comp.ci_low * (1 - VERIFY_DRIFT) <= recorded <= comp.ci_high * (1 + VERIFY_DRIFT))
