"""The group-sequential plan: its boundaries, and its false-accept rate checked by simulation."""

import pytest

from trainbridge.measure import sequential


def test_the_boundaries_are_the_published_ones():
    # Lan-DeMets O'Brien-Fleming-type, 3 equal looks, one-sided 0.025: 3.71, 2.51, 1.99
    obf = sequential.plan(3, 0.95, 3, "obrien_fleming")
    assert [round(c, 2) for c in obf.boundaries_z] == [3.71, 2.51, 1.99]
    # Pocock-type spends evenly: three boundaries near 2.29
    poc = sequential.plan(3, 0.95, 3, "pocock")
    assert all(abs(c - 2.29) < 0.02 for c in poc.boundaries_z)


def test_one_look_is_a_plain_t_test_at_the_configured_confidence():
    p = sequential.plan(1, 0.95, 3)
    assert p.t_scale == 1.0 and abs(p.confidence_at(1) - 0.95) < 1e-6


@pytest.mark.parametrize("spending", ["pocock", "obrien_fleming"])
def test_the_z_levels_would_overspend_with_t_intervals_and_the_plan_corrects_them(spending):
    p = sequential.plan(3, 0.95, 3, spending)
    assert p.t_scale < 0.95  # the z-levels cross more often than alpha once the variance is estimated
    assert abs(p.computed_alpha - 0.025) < 5e-4


@pytest.mark.parametrize("sd_log", [0.02, 0.07])
@pytest.mark.parametrize("spending", ["pocock", "obrien_fleming"])
def test_the_whole_rule_at_the_bar_accepts_at_most_alpha_on_fresh_draws(spending, sd_log):
    p = sequential.plan(3, 0.95, 3, spending)
    sims = 40_000
    rate = sequential.simulated_false_accept_rate(p, sd_log=sd_log, bar=0.02, sims=sims, seed=7)
    se = (0.025 * 0.975 / sims) ** 0.5
    assert rate <= 0.025 + 3 * se, rate


def test_looking_three_times_at_a_plain_95_percent_interval_would_not_hold_alpha():
    # the reason for the plan: three unadjusted looks at 95% cross far more often than 2.5%
    naive = sequential.SequentialPlan(looks=3, alpha_one_sided=0.025, spending="pocock", pairs_per_look=3,
                                      boundaries_z=[1.96] * 3, t_scale=1.0, nominal_alpha=[0.025] * 3,
                                      computed_alpha=0.025)
    assert sequential.simulated_false_accept_rate(naive, sd_log=0.05, bar=0.02, sims=40_000, seed=7) > 0.04


def test_a_look_needs_two_pairs():
    with pytest.raises(ValueError):
        sequential.plan(3, 0.95, 1)
