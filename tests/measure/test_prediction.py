"""Calibrated predictions (issue 22, item 2): a recipe's raw prediction is scaled by what it
realised when measured, shipped measurements first, this run's own as they come."""

import json

import numpy as np
import pytest

from trainbridge.agent.rewriters.recipes import RECIPES
from trainbridge.measure import prediction as pred
from trainbridge.measure.prediction import (
    Observation, PredictionCheck, ShippedShares, calibration, fit, saving_pct, shipped)
from trainbridge.measure.statistics import compare


def _obs(recipe: str, raw: float, measured: float, target: str = "cpu") -> Observation:
    return Observation(recipe=recipe, target=target, raw_saving_ms=raw, measured_saving_ms=measured)


def _table(*shares) -> ShippedShares:
    return ShippedShares(cpu="test cpu", date="2026-12-07", command="test", ledgers=[], shares=fit(list(shares)))


def test_the_ratio_is_measured_over_predicted_clipped_and_undefined_for_a_tiny_prediction():
    assert _obs("r", 10.0, 2.0).ratio == pytest.approx(0.2)
    assert _obs("r", 1.0, 50.0).ratio == pred.RATIO_MAX
    assert _obs("r", 1.0, -50.0).ratio == pred.RATIO_MIN
    assert _obs("r", pred.MIN_RAW_MS / 2, 1.0).ratio is None


def test_a_recipe_with_no_measurement_keeps_its_raw_prediction_and_says_so():
    cal = calibration("sdpa_attention", "cpu", [], table=_table())
    assert cal.factor == 1.0 and "no shipped measurement" in cal.note


def test_an_unmeasured_recipe_starts_from_the_median_of_the_measured_ones_on_its_target():
    table = _table(_obs("a", 10.0, 1.0), _obs("b", 10.0, 3.0), _obs("c", 10.0, 20.0),
                   _obs("d", 10.0, 5.0, target="npu"))
    cal = calibration("threads_knob", "cpu", [], table=table)
    assert cal.factor == pytest.approx(0.3) and "median of the 3 recipes" in cal.note  # of 0.1, 0.3, 2.0
    own = [_obs("threads_knob", 1.0, 1.0)]
    assert calibration("threads_knob", "cpu", own, table=table).factor == pytest.approx((0.3 + 1.0) / 2)
    assert calibration("threads_knob", "cuda", [], table=table).factor == 1.0  # nothing measured on cuda


def test_the_shipped_factor_applies_and_this_runs_measurements_pull_it_their_way():
    table = _table(*[_obs("fused_optimizer", 10.0, 2.0) for _ in range(5)])  # realised 0.2, five times
    assert calibration("fused_optimizer", "cpu", [], table=table).factor == pytest.approx(0.2)
    assert calibration("fused_optimizer", "npu", [], table=table).factor == 1.0  # nothing measured on npu
    own = [_obs("fused_optimizer", 5.0, 5.0), _obs("fused_optimizer", 5.0, 5.0)]  # this program realises it all
    cal = calibration("fused_optimizer", "cpu", own, table=table)
    # the shipped table counts as two measurements: (2 x 0.2 + 1 + 1) / 4
    assert cal.factor == pytest.approx(0.6) and cal.run_n == 2 and "this run's 2" in cal.note
    # another recipe's measurements do not move it
    assert calibration("fused_optimizer", "cpu", [_obs("gelu_fused", 1.0, -1.0)], table=table).factor \
        == pytest.approx(0.2)


def test_a_recipe_measured_slower_gets_a_negative_prediction():
    table = _table(_obs("rms_norm_fused", 4.0, -2.0), _obs("rms_norm_fused", 4.0, -1.0))
    assert calibration("rms_norm_fused", "cpu", [], table=table).factor < 0


def test_the_observation_of_a_comparison_is_the_incumbents_step_times_the_saved_share():
    rng = np.random.default_rng(0)
    inc = [list(100 * (1 + 0.01 * rng.standard_normal(20))) for _ in range(3)]
    cand = [list(80 * (1 + 0.01 * rng.standard_normal(20))) for _ in range(3)]
    comp = compare(inc, cand)
    o = Observation.of("r", "cpu", 40.0, comp)
    assert o.measured_saving_ms == pytest.approx(comp.median_incumbent_ms * (1 - 1 / comp.speedup))
    assert o.ratio == pytest.approx(o.measured_saving_ms / 40.0) and 0.4 < o.ratio < 0.6
    check = PredictionCheck.of(40.0, comp)  # 40% predicted, about 20% measured
    assert check.far and check.missed_by_pct > 15
    assert not PredictionCheck.of(comp.median_incumbent_ms * saving_pct(comp.speedup) / 100, comp).far


def test_the_shipped_table_is_measured_and_names_real_recipes_and_its_machine():
    table = shipped()
    assert table is not None, "trainbridge/measure/realised_shares.json is missing: python benchmarks/predictions.py " \
                              "--write-defaults"
    assert table.cpu and table.command.startswith("python benchmarks/predictions.py") and table.ledgers
    assert table.shares and all(s.recipe in RECIPES for s in table.shares)
    for s in table.shares:  # the factor is the mean of the raw ratios it keeps
        assert s.n == len(s.ratios) and s.factor == pytest.approx(sum(s.ratios) / s.n, abs=1e-3)


def test_the_shipped_table_round_trips(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(_table(_obs("gelu_fused", 2.0, 1.0)).model_dump_json())
    got = pred._load(str(p))
    assert got.get("gelu_fused", "cpu").factor == pytest.approx(0.5)
    assert json.loads(p.read_text())["shares"][0]["ratios"] == [0.5]


def test_every_ledger_the_shipped_table_was_fitted_on_is_in_the_repository():
    from tests.kits.paths import ROOT

    assert all((ROOT / rel).is_file() for rel in shipped().ledgers), shipped().ledgers


def test_a_runs_compiled_port_arm_is_one_measurement_of_compile_model(tmp_path):
    """The closing session timed torch.compile of the whole port: with the raw prediction the loop
    logged beside it, that is compile_model's realised share, read from the ledger alone."""
    import importlib.util

    from tests.kits.paths import ROOT

    spec = importlib.util.spec_from_file_location("predictions_bench", ROOT / "benchmarks" / "predictions.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    src = ROOT / "benchmarks" / "results" / "workloads_cpu-2026-12-07_ledgers" / "nanogpt.ledger.jsonl"
    lines = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    for e in lines:
        if e["event"] == "run_finished":
            e["end_to_end"]["compiled_port_raw_saving_ms"] = 20.0
            comp = e["end_to_end"]["compiled_port_vs_port"]
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("".join(json.dumps(e) + "\n" for e in lines))
    obs, why = bench.compiled_port_observation(ledger)
    assert why == "" and obs.recipe == "compile_model" and obs.raw_saving_ms == 20.0
    measured = comp["median_incumbent_ms"] * saving_pct(comp["speedup"]) / 100.0
    assert obs.measured_saving_ms == pytest.approx(measured) and obs.ratio == pytest.approx(min(measured / 20.0, 2.0))
    for e in lines:  # a run that timed no compiled port measured nothing of it
        if e["event"] == "run_finished":
            e["end_to_end"]["compiled_port_vs_port"] = None
    ledger.write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert bench.compiled_port_observation(ledger) == (None, "ledger.jsonl: no compiled port timed")
