"""The step-paired statistic (lockstep steps k of both arms ran back to back) and the rule's
operating characteristics: what it accepts at no effect, at the bar and at 2%."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainbridge.measure import sequential
from trainbridge.measure.statistics import compare, round_log_ratios, steps_pair_up


def lockstep_rounds(n_rounds: int, steps: int, *, gain: float, drift_sd: float, pair_sd: float, seed: int = 0):
    """Rounds where both arms share each step's machine state (a slow stretch hits both) and
    differ by `gain` plus a small independent noise per step."""
    rng = np.random.default_rng(seed)
    inc, cand = [], []
    for _ in range(n_rounds):
        shared = 100.0 * np.exp(np.cumsum(rng.normal(0, drift_sd, steps)))  # the machine drifts within a round
        inc.append(list(shared * (1 + gain) * np.exp(rng.normal(0, pair_sd, steps))))
        cand.append(list(shared * np.exp(rng.normal(0, pair_sd, steps))))
    return inc, cand


def test_a_drift_both_arms_share_cancels_in_the_step_paired_interval():
    inc, cand = lockstep_rounds(4, 50, gain=0.03, drift_sd=0.03, pair_sd=0.01, seed=1)
    paired = compare(inc, cand, min_effect=0.005)
    assert paired.run_ci_kind == "step_paired" and len(paired.round_log_ratios) == 4
    assert paired.decision == "accept", paired.reason
    assert paired.speedup == pytest.approx(1.03, abs=0.01)
    # the same samples with the step pairing broken (run medians only) do not resolve the gain
    shuffled = [list(np.random.default_rng(i).permutation(c)) for i, c in enumerate(cand)]
    unpaired_inc = [r + [r[-1]] for r in inc]  # one step more: the runs no longer pair step by step
    medians = compare(unpaired_inc, shuffled, min_effect=0.005)
    assert medians.run_ci_kind == "paired" and medians.round_log_ratios == []
    assert (paired.ci_high - paired.ci_low) < 0.5 * (medians.ci_high - medians.ci_low)


def test_a_stray_slow_step_does_not_move_the_trimmed_estimate():
    inc, cand = lockstep_rounds(4, 50, gain=0.0, drift_sd=0.0, pair_sd=0.01, seed=2)
    before = compare(inc, cand, min_effect=0.005)
    cand[1][7] *= 3.0  # a neighbour's burst in one candidate step
    after = compare(inc, cand, min_effect=0.005)
    assert abs(math.log(after.speedup / before.speedup)) < 0.002
    assert after.decision == "reject"


def test_the_same_program_is_not_taken_for_faster():
    accepted = 0
    for seed in range(40):
        inc, cand = lockstep_rounds(4, 50, gain=0.0, drift_sd=0.02, pair_sd=0.06, seed=100 + seed)
        accepted += compare(inc, cand, min_effect=0.005, n_boot=400, seed=seed).decision == "accept"
    assert accepted <= 2


def test_round_log_ratios_are_trimmed_means_of_step_log_ratios():
    a = np.array([110.0] * 8 + [500.0, 1.0])  # two wild steps, cut by the 20% trim
    b = np.array([100.0] * 10)
    assert round_log_ratios([a], [b])[0] == pytest.approx(math.log(1.1))
    assert steps_pair_up([a], [b]) and not steps_pair_up([a], [b[:9]]) and not steps_pair_up([a[:4]], [b[:4]])


def test_the_rule_accepts_at_the_bar_at_its_computed_rate_and_resolves_two_percent():
    p = sequential.plan(3, 0.95, 4)
    at_bar = sequential.operating_point(p, sd_log=0.013, bar=0.005, effect=0.005, sims=20_000, seed=3)
    assert at_bar.accept_rate <= 0.025 + 0.004
    none = sequential.operating_point(p, sd_log=0.013, bar=0.005, effect=0.0, sims=20_000, seed=3)
    assert none.accept_rate < at_bar.accept_rate and none.mean_pairs < 3 * 4
    two = sequential.operating_point(p, sd_log=0.013, bar=0.005, effect=0.02, sims=20_000, seed=3)
    assert two.accept_rate > 0.8
    mde = sequential.minimum_detectable_effect(p, sd_log=0.013, bar=0.005, sims=5_000, seed=3)
    assert 0.005 < mde < 0.02
    # noisier rounds need a larger effect
    assert sequential.minimum_detectable_effect(p, sd_log=0.03, bar=0.005, sims=5_000, seed=3) > mde


def test_a_candidate_that_moves_work_into_every_fifth_step_is_not_taken_for_faster():
    # The attack on any robust statistic: 10% faster on four steps in five, 3x slower on the
    # fifth (work deferred and done in a batch). The trimmed mean cuts those steps away; the
    # training takes longer. The mean step over all timed steps must be shorter too.
    rng = np.random.default_rng(5)
    inc, cand = [], []
    for _ in range(8):
        base = 100.0 * np.exp(rng.normal(0, 0.01, 50))
        inc.append(list(base))
        cand.append(list(np.where(np.arange(50) % 5 == 4, 3.0, 0.9) * base * np.exp(rng.normal(0, 0.01, 50))))
    c = compare(inc, cand, min_effect=0.0)
    assert c.ci_low > 1.0 and c.speedup > 1.05  # what the trimmed statistic alone would accept
    assert c.mean_speedup < 0.8 and c.decision == "reject" and "mean step is not" in c.reason, c.reason
    # an honest gain keeps its accept
    honest = compare(inc, [list(np.asarray(r) / 1.03) for r in inc], min_effect=0.0)
    assert honest.decision == "accept" and honest.mean_speedup > 1.02
