"""The mechanism a candidate is checked against is the one its own change claims.

A model asked to realise one plan item may answer with another recipe or its own edit; the
validation must check *that* change's mechanism, neither skip it nor demand the item's (an
SDPA candidate proposed for a precision item moves no GEMM to bf16)."""

from trainbridge.agent.planner import Hypothesis, PlanItem, candidate_hypothesis
from trainbridge.agent.rewriters.llm import lowers_precision


def _item(recipe, pattern, **hyp) -> PlanItem:
    h = Hypothesis(ops_removed=hyp.pop("ops_removed", []), predicted_saving_ms=1.0, predicted_saving_pct=2.0,
                   reject_if="x", **hyp)
    return PlanItem(key=recipe, recipe=recipe, pattern=pattern, level="L0", gap_class="porting_artifact",
                    confidence=0.5, score=1.0, hypothesis=h)


PRECISION = _item("autocast_reapply", "precision", gemm_precision="lower")


def test_a_recipe_candidate_keeps_its_items_hypothesis():
    assert candidate_hypothesis(PRECISION, "recipe:autocast_reapply", "cpu") == PRECISION.hypothesis
    assert candidate_hypothesis(PRECISION, "llm:m+recipe:autocast_reapply", "cpu") == PRECISION.hypothesis


def test_another_recipe_chosen_by_the_model_is_checked_as_that_recipe():
    sdpa = candidate_hypothesis(PRECISION, "llm:m+recipe:sdpa_attention", "cpu", ops_claimed=["aten::_softmax"])
    assert sdpa.gemm_precision is None and not sdpa.compiled_region and sdpa.ops_removed == ["aten::_softmax"]
    comp = candidate_hypothesis(PRECISION, "llm:m+recipe:compile_region", "cpu")
    assert comp.compiled_region and comp.ops_removed == [] and comp.gemm_precision is None
    norm = _item("rms_norm_fused", "rms_norm", ops_removed=["aten::pow"])
    auto = candidate_hypothesis(norm, "llm:m+recipe:autocast_reapply", "cpu", ops_claimed=["aten::mm"])
    assert auto.gemm_precision == "lower" and auto.ops_removed == []


def test_a_models_own_edit_is_checked_against_its_own_claim():
    before = {"t.py": "y = model(x)\n"}
    lerp = {"t.py": "y = torch.lerp(a, b, w)\n"}
    cast = {"t.py": "with torch.autocast('cpu', dtype=torch.bfloat16):\n    y = model(x)\n"}
    assert not lowers_precision(before, lerp) and lowers_precision(before, cast)
    h = candidate_hypothesis(PRECISION, "llm:m", "cpu", ops_claimed=["aten::mul"],
                             lowers_precision=lowers_precision(before, lerp))
    assert h.gemm_precision is None and h.ops_removed == ["aten::mul"]
    h = candidate_hypothesis(PRECISION, "llm:m", "cpu", ops_claimed=[], lowers_precision=lowers_precision(before, cast))
    assert h.gemm_precision == "lower"
