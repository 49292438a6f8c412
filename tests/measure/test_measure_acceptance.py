"""The keep/reject policy (`measure.acceptance`): each rule tried on data made to trip it,
and the one bar reaching the end-to-end report and `ledger verify`."""

from types import SimpleNamespace

import numpy as np
import pytest

from trainbridge.ledger import models as ev
from trainbridge.measure import acceptance as acc
from trainbridge.measure.statistics import compare


def runs(median_ms, n, *, run_sd=0.005, step_sd=0.01, steps=10, seed=0):
    rng = np.random.default_rng(seed)
    return [list(median_ms * (1 + rng.normal(0, run_sd)) * (1 + rng.normal(0, step_sd, steps))) for _ in range(n)]


def test_a_raised_bar_rounds_up_to_half_a_percent():
    assert acc.raised_bar(0.0301) == 0.035 and acc.raised_bar(0.0299) == 0.03


def test_a_quiet_baseline_keeps_the_configured_bar():
    aa, bar = acc.calibrated_bar(runs(100, 8, run_sd=0.002, seed=3), min_effect=0.02, confidence=0.95,
                                 max_false_accept_rate=0.05)
    assert bar == 0.02 and aa.false_accept_rate <= 0.05


def test_a_noisy_baseline_raises_the_bar_until_the_a_a_splits_pass():
    noisy = runs(100, 8, run_sd=0.06, seed=12)
    first = acc.calibrate_aa(noisy, min_effect=0.0, confidence=0.95, target_rate=0.05)
    assert first.false_accept_rate > 0.05  # the data trips the rule at a zero bar
    aa, bar = acc.calibrated_bar(noisy, min_effect=0.0, confidence=0.95, max_false_accept_rate=0.05)
    assert bar > 0 and round(bar / acc.BAR_STEP, 9).is_integer()
    assert aa.min_effect == bar and aa.false_accept_rate <= 0.05


def _comp(speedup_runs_inc, speedup_runs_cand, bar):
    return compare(speedup_runs_inc, speedup_runs_cand, min_effect=bar, confidence=0.95)


def _seq(first, again, looks=3):
    asked = []

    def more():
        asked.append(1)
        return again
    i, c, comp, note = acc.judge_sequentially(first, more, bar=0.02, confidence=0.95, looks=looks, pairs_per_look=3)
    return i, c, comp, note, len(asked)


def test_a_gain_above_three_times_is_looked_at_again():
    inc, cand = runs(400, 3), runs(100, 3, seed=1)
    assert _comp(inc, cand, 0.02).suspicious
    i, c, comp, note, asked = _seq((inc, cand), (runs(400, 3, seed=2), runs(100, 3, seed=3)))
    assert asked == 1 and len(i) == 6 and comp.decision == "accept" and "suspicious" in note


def test_a_clear_result_is_judged_once():
    inc, cand = runs(110, 3, seed=4), runs(100, 3, seed=5)
    i, c, comp, note, asked = _seq((inc, cand), (inc, cand))
    assert comp.decision == "accept" and not asked and "look 1/3" in note
    # judged at the first look's level, stricter than a single look's 95%
    assert comp.confidence > 0.95


WIDE_INC = [[100.0] * 5, [130.0] * 5, [100.0] * 5]
WIDE_CAND = [[90.0] * 5, [88.0] * 5, [120.0] * 5]


def test_an_interval_straddling_the_bar_gets_more_pairs_up_to_the_cap():
    comp = _comp(WIDE_INC, WIDE_CAND, 0.02)
    assert comp.decision == "reject" and comp.ci_low < 1.02 < comp.ci_high and comp.speedup > 1.04
    i, c, comp, note, asked = _seq((WIDE_INC, WIDE_CAND), (WIDE_INC, WIDE_CAND))
    assert asked == 2 and len(i) == len(c) == 9 and "look 3/3" in note


def test_more_pairs_that_settle_it_stop_the_looks():
    inc, cand = [[110.0] * 5, [112.0] * 5, [104.0] * 5], [[100.0] * 5] * 3
    first = _comp(inc, cand, 0.02)
    assert first.ci_low < 1.02 < first.ci_high and first.speedup > 1.05
    steady_inc, steady_cand = runs(110, 3, seed=6), runs(100, 3, seed=7)
    i, c, comp, note, asked = _seq((inc, cand), (steady_inc, steady_cand))
    assert comp.decision == "accept" and asked == 1 and "look 2/3" in note


def test_a_result_short_of_half_the_bar_is_not_timed_again():
    inc, cand = [[100.0] * 5, [125.0] * 5, [100.0] * 5], [[100.0] * 5, [100.0] * 5, [125.0] * 5]
    comp = _comp(inc, cand, 0.02)
    assert comp.ci_low < 1.02 < comp.ci_high and comp.speedup < 1.01
    *_, comp, note, asked = _seq((inc, cand), (inc, cand))
    assert asked == 0 and comp.decision == "reject"


def test_one_look_is_one_session_at_the_configured_confidence():
    *_, comp, note, asked = _seq((WIDE_INC, WIDE_CAND), (WIDE_INC, WIDE_CAND), looks=1)
    assert asked == 0 and abs(comp.confidence - 0.95) < 1e-9


def test_the_repair_budget():
    assert not acc.may_repair("recipe:rms_norm_fused", 0, True)  # a recipe would write the same program
    assert not acc.may_repair("llm:m", 0, False)                  # a rewriter that cannot repair
    assert acc.may_repair("llm:m", acc.MAX_LOOP_REPAIRS - 1, True)
    assert not acc.may_repair("llm:m", acc.MAX_LOOP_REPAIRS, True)


def test_verify_holds_only_inside_todays_interval_and_above_one():
    comp = SimpleNamespace(ci_low=1.10, ci_high=1.30, n_runs_incumbent=3)
    assert acc.verify_holds(1.2, comp) and acc.verify_holds(1.36, comp)  # within the drift allowance
    assert not acc.verify_holds(1.5, comp) and not acc.verify_holds(None, comp)
    assert not acc.verify_holds(1.0, SimpleNamespace(ci_low=0.99, ci_high=1.02, n_runs_incumbent=3))


def test_a_recorded_runs_bar_is_its_baselines():
    b = {"run_id": "r", "time_utc": ev.utc_now()}
    base = ev.BaselineMeasured(**b, runs_ms=[[1.0]], losses=[1.0], flops_per_step=1, work_items_per_step=[1],
                               ops_per_step=None, median_ms=1.0, verdict="unknown", profile_path="p", min_effect=0.035)
    assert acc.run_bar([base], 0.02) == 0.035 and acc.run_bar([], 0.02) == 0.02


def test_the_end_to_end_report_keeps_rounds_paired_and_judges_at_the_runs_bar(monkeypatch, tmp_path):
    import trainbridge.agent.report as report

    n = {"final": 0}

    def fake_arm(workload, target, files, *, out_dir, label, seed, **kw):
        def run():
            if label == "final":
                n["final"] += 1
                if n["final"] == 2:
                    return SimpleNamespace(status="crashed", error="x", measured_ms=[])
            return SimpleNamespace(status="ok", error=None, measured_ms=[100.0 if label == "port" else 97.0])
        return run

    monkeypatch.setattr(report, "program_arm", fake_arm)
    ctx = SimpleNamespace(cfg=SimpleNamespace(target="cpu", seed=1, confidence=0.95, timing_scheme="pairs"),
                          workload=SimpleNamespace(manifest=SimpleNamespace(steps=SimpleNamespace(warmup=1))),
                          report=lambda *a, **k: None,
                          profile=lambda: SimpleNamespace(all_ops=[], top_ops=[], outside_ops_ms_per_step=5.0,
                                                          elementwise_share=0.25, op_self_ms_per_step=80.0,
                                                          gemm_share=0.5, floor=None))
    e2e = report.end_to_end(ctx, {}, {}, pairs=4, with_compile=True, out=tmp_path, bar=0.035)
    lens = {arm: len(r) for arm, r in e2e["runs_ms"].items()}
    # the round with the crashed run is dropped whole and measured again: 4 paired rounds
    assert lens == {"port": 4, "final": 4, "compiled_port": 4} and len(e2e["problems"]) == 1
    fvp = e2e["final_vs_port"]
    assert fvp["min_effect"] == 0.035 and fvp["decision"] == "reject"  # 1.031x clears 2%, not the raised 3.5%
    assert ev.EndToEnd.model_validate(e2e).min_effect == 0.035
    # beside the compiled-port arm, compile_model's raw prediction: (outside ops + elementwise) x 0.4
    assert e2e["compiled_port_raw_saving_ms"] == pytest.approx((5.0 + 0.25 * 80.0) * 0.4)


def test_verify_refuses_fewer_pairs_than_can_show_noise(tmp_path):
    from trainbridge.review.verify import verify_run

    with pytest.raises(ValueError, match=f"at least {acc.MIN_VERIFY_PAIRS} pairs"):
        verify_run(tmp_path, pairs=1)
    one_pair = SimpleNamespace(ci_low=1.2, ci_high=1.4, n_runs_incumbent=1)
    assert not acc.verify_holds(1.3, one_pair)
