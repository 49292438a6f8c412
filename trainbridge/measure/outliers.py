"""Outlier-contaminated rounds: a broken pair is measured again, never averaged into an interval.

A timing session's unit is the round: every arm run once (pairs) or side by side (lockstep),
and the statistics take one log ratio per round (`statistics.round_log_ratios`: the trimmed
mean of the step-paired log ratios, or the log ratio of run medians when the steps do not pair
up). A round in which one process was hit by something the others were not (a compile in the
measured steps, a burst of host load, a swapped page cache) gives a ratio far from every other
round of its session, and one such round can stretch an interval to [0.33, 3.9]. Failed and
truncated runs were already dropped (`timing`); this rule drops the contaminated ones.

The rule, as written to the ledger (`OUTLIER_RULE`): with at least `MIN_ROUNDS` kept rounds,
a round whose log ratio (each arm against the session's first arm) lies farther from the
session's median round than `ROBUST_SDS` robust standard deviations (1.4826 x the median
absolute deviation over the session's rounds), and at least `MIN_DEVIATION` (a factor of 2)
away, is contaminated. It is dropped and a replacement round measured in its place, within the
session's replacement budget. The factor-2 floor keeps the rule to gross breakage: an honest
round under the one-process-after-the-other scheme differs from the session's median by about
10% on nanogpt (round sd 0.096 in the calibration), under lockstep by under 2%, but by 30% on a
3.5 ms-step toy program (an A/A session of the test suite, where a 25% floor dropped two honest
rounds), so selecting rounds by their value must not reach honest spreads
(`benchmarks/outlier_rule.py` counts how often the rule fires on the rounds measured here).
"""

from __future__ import annotations

import math

import numpy as np

from .statistics import round_log_ratios, steps_pair_up

MIN_ROUNDS = 3
ROBUST_SDS = 5.0
MIN_DEVIATION = math.log(2.0)
MAD_TO_SD = 1.4826

OUTLIER_RULE = (
    f"a round whose log step ratio against the session's first arm (step-paired trimmed mean, else run medians) "
    f"lies more than max({ROBUST_SDS:g} robust SDs (1.4826 x MAD over the session's rounds), log 2) from the "
    f"session's median round is outlier-contaminated: dropped and measured again, never averaged; sessions of "
    f"fewer than {MIN_ROUNDS} kept rounds are not checked")


def round_logs(base: list[list[float]], other: list[list[float]]) -> np.ndarray:
    """One log(base / other) per round: step-paired when the runs' steps pair up, else run medians."""
    a = [np.asarray(r, float) for r in base]
    b = [np.asarray(r, float) for r in other]
    if steps_pair_up(a, b):
        return round_log_ratios(a, b)
    return np.array([math.log(float(np.median(x)) / float(np.median(y))) for x, y in zip(a, b)])


def contaminated_rounds(runs_ms: dict[str, list[list[float]]]) -> dict[int, str]:
    """Round index -> why it is contaminated, over every arm against the first arm."""
    arms = list(runs_ms)
    if len(arms) < 2:
        return {}
    base = runs_ms[arms[0]]
    if len(base) < MIN_ROUNDS or any(not r for arm in arms for r in runs_ms[arm]):
        return {}
    found: dict[int, str] = {}
    for arm in arms[1:]:
        logs = round_logs(base, runs_ms[arm])
        median = float(np.median(logs))
        mad = float(np.median(np.abs(logs - median)))
        limit = max(ROBUST_SDS * MAD_TO_SD * mad, MIN_DEVIATION)
        for k, value in enumerate(logs):
            if abs(value - median) > limit and k not in found:
                found[k] = (f"{arms[0]}/{arm} {math.exp(value):.3f}x against the session's median round "
                            f"{math.exp(median):.3f}x (log deviation {abs(value - median):.3f} > limit {limit:.3f})")
    return found
