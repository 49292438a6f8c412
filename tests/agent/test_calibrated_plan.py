"""The loop learns from what it measures (issue 22, item 2): a measured recipe candidate's
realised share goes into the state, and the planner's next predictions for that recipe are
calibrated with it, so a recipe that disappointed ranks below one that has not been tried."""

import pytest

from tests.agent.test_combined_near_misses import PROGRAM, _comparison, _ctx, _measured
from trainbridge.agent.candidate import Candidate
from trainbridge.agent.nodes import decide, plan
from trainbridge.agent.planner import Hypothesis, PlanItem, make_item
from trainbridge.agent.rewriters.recipes import RECIPES
from trainbridge.agent.programs import write_program
from trainbridge.measure import prediction as pred
from trainbridge.measure.prediction import Observation, ShippedShares
from trainbridge.profile.analysis import OpRow


@pytest.fixture
def no_shipped_table(monkeypatch):
    empty = ShippedShares(cpu="none", date="-", command="-", ledgers=[], shares=[])
    monkeypatch.setattr(pred, "shipped", lambda *a, **k: empty)


def _runtime(tmp_path, decisions, ops):
    from types import SimpleNamespace

    ctx = _ctx(tmp_path, decisions)
    prof = ctx.profile()
    prof.top_ops = [OpRow(name=n, calls_per_step=4, self_ms_per_step=ms, share=ms / 50, kind="elementwise/reduction")
                    for n, ms in ops.items()]
    ctx.profile = lambda: prof
    return SimpleNamespace(context=ctx)


def _plan(tmp_path, runtime, **state):
    write_program(tmp_path / "incumbent", {"m.py": PROGRAM})
    out = plan({"incumbent_dir": str(tmp_path / "incumbent"), "n_candidates": 0, **state}, runtime)
    return Candidate.model_validate(out["current"]).item


def test_a_measured_recipe_is_recorded_with_what_it_realised(tmp_path, no_shipped_table):
    decisions: list = []
    runtime = _runtime(tmp_path, decisions, {})
    h = Hypothesis(ops_removed=["aten::tanh"], predicted_saving_ms=20.0, predicted_saving_pct=20.0,
                   uncalibrated_saving_ms=20.0, reject_if="x")
    item = PlanItem(key="gelu_fused", recipe="gelu_fused", pattern="gelu_tanh", level="L2", gap_class="g",
                    confidence=0.5, score=1.0, hypothesis=h)
    comp = _comparison(1.05, 0.01)  # about 4.8 ms of a 100 ms step
    out = decide(_measured("c01-gelu_fused", item, comp), runtime)
    (obs,) = [Observation.model_validate(d) for d in out["realised"]]
    assert obs.recipe == "gelu_fused" and obs.source == "c01-gelu_fused"
    assert obs.ratio == pytest.approx(comp.median_incumbent_ms * (1 - 1 / comp.speedup) / 20.0)
    # a combined candidate is the sum of its parts: it calibrates none of them
    combo = item.model_copy(update={"combines": [item, item]})
    assert "realised" not in decide(_measured("c02-combined", combo, comp), runtime)


def test_the_next_plan_ranks_a_disappointing_recipe_below_an_untried_one(tmp_path, no_shipped_table):
    decisions: list = []
    # the GELU's operators take more of the profile than the attention's: raw, it ranks first
    runtime = _runtime(tmp_path, decisions, {"aten::tanh": 8.0, "aten::pow": 6.0, "aten::_softmax": 3.0})
    first = _plan(tmp_path, runtime)
    assert first.recipe == "gelu_fused", first.key
    assert first.hypothesis.uncalibrated_saving_ms == first.hypothesis.predicted_saving_ms
    assert "factor 1" in first.hypothesis.calibration
    # measured at another site in this run, the GELU rewrite made things slower
    slower = Observation(recipe="gelu_fused", target="cpu", raw_saving_ms=5.0, measured_saving_ms=-2.0)
    second = _plan(tmp_path, runtime, realised=[slower.model_dump()], tried=[])
    assert second.recipe != "gelu_fused", second.key
    # what is left of it: (1 x factor 1 + 1 x ratio -0.4) / 2 of the raw prediction
    item = make_item(RECIPES["gelu_fused"], runtime.context.profile(), intent=None, min_effect=0.02, target="cpu",
                     observed=[slower])
    assert item.hypothesis.predicted_saving_ms == pytest.approx(0.3 * item.hypothesis.uncalibrated_saving_ms, abs=1e-3)
    assert "this run's 1: -0.40" in item.hypothesis.calibration
