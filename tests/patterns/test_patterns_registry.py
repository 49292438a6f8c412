"""The pattern and target registries are the one vocabulary: every stage that names a
pattern, a level or a target names one the registries hold, and they agree on what it means."""

from __future__ import annotations

import re

import pytest

from trainbridge.agent.planner import predicted_saving_ms
from trainbridge.agent.rewriters.recipes import RECIPES, recipes_for
from trainbridge.evidence.recognize import recognize
from trainbridge.patterns import LEVEL_COST, LEVELS, PATTERNS, level_rank, pattern_spec
from trainbridge.profile.analysis import OpRow, ProfileReport
from trainbridge.targets import TARGET_NAMES, TARGETS, get_target, target_spec
from trainbridge.targets.npu_catalog import load_catalog

from tests.kits.paths import FIXTURES

CASTS = {"aten::_to_copy"}  # a port's casts: a recipe may remove them beside its pattern's own ops
# Named by the torch_npu affinity list; no documented signature to put in the npu catalog yet.
NPU_OPS_WITHOUT_CATALOG_ENTRY = {"npu_add_layer_norm"}


def test_every_level_has_a_cost_and_a_rank():
    assert set(LEVEL_COST) == set(LEVELS)
    assert [level_rank(lv) for lv in LEVELS] == list(range(len(LEVELS)))
    assert level_rank("L9") == len(LEVELS)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_recipe_names_a_registered_pattern_and_removes_only_its_ops(name):
    recipe = RECIPES[name]
    spec = PATTERNS[recipe.pattern]
    assert recipe.level in LEVELS and set(recipe.targets) <= set(TARGET_NAMES)
    assert all(recipe.level_for(t) in LEVELS for t in recipe.targets)
    extra = set(recipe.ops_removed) - set(spec.eager_ops) - CASTS
    assert not extra, f"{name} claims to remove {extra}, which {recipe.pattern}'s eager form does not spend time in"


def test_recipes_for_sorts_by_the_registrys_ladder():
    for target in TARGET_NAMES:
        for pattern in PATTERNS:
            ranks = [level_rank(r.level_for(target)) for r in recipes_for(pattern, target)]
            assert ranks == sorted(ranks)


def test_every_pattern_the_evidence_recognises_has_target_operators_for_every_target():
    ops = {"pow", "mean", "rsqrt", "mul", "add", "cat", "neg", "slice", "_softmax", "relu", "silu", "gelu",
           "tanh", "_log_softmax", "nll_loss_forward", "native_layer_norm", "addcmul", "sqrt", "div", "lerp"}
    found = {m.pattern for m in recognize(sorted(ops), "x.square() tanh", "forward", "pointwise", 2)}
    assert found, "the recogniser found nothing: the check below would be empty"
    for pattern in found:
        spec = PATTERNS[pattern]
        assert set(spec.target_ops) == set(TARGET_NAMES), pattern
        assert spec.title


def test_the_npu_catalog_and_the_registry_agree_on_which_pattern_an_operator_realises():
    catalog = list(load_catalog())
    by_op = {}
    for entry in catalog:
        assert entry.pattern in PATTERNS, entry.name
        for op in re.findall(r"torch_npu(?:\.optim)?\.(\w+)", entry.api):
            by_op.setdefault(op, set()).add(entry.pattern)
    named = 0
    for spec in PATTERNS.values():
        for op in spec.target_ops.get("npu", ()):
            for name in re.findall(r"torch_npu(?:\.optim)?\.(\w+)", op.api):
                if name in NPU_OPS_WITHOUT_CATALOG_ENTRY:
                    continue
                named += 1
                assert name in by_op, f"{spec.name} offers torch_npu.{name}, which the npu catalog lacks"
                # the operator realises the pattern, or a part of it (cross entropy inside softcap + CE)
                parts = {p for p in by_op[name] if set(PATTERNS[p].eager_ops) <= set(spec.eager_ops)}
                assert spec.name in by_op[name] or parts, (spec.name, name, by_op[name])
    assert named >= 10


def test_the_planner_predicts_from_the_registrys_ops_and_share():
    spec = PATTERNS["rms_norm"]
    ops = [OpRow(name=n, calls_per_step=1, self_ms_per_step=2.0, share=0.03, kind="elementwise/reduction")
           for n in spec.eager_ops]
    ops.append(OpRow(name="aten::mm", calls_per_step=1, self_ms_per_step=50.0, share=0.8, kind="gemm"))
    profile = ProfileReport.model_construct(all_ops=ops, top_ops=ops, outside_ops_ms_per_step=0.0,
                                            op_self_ms_per_step=60.0, gemm_share=0.8)
    assert predicted_saving_ms("rms_norm", profile) == pytest.approx(2.0 * len(spec.eager_ops) * spec.removable_share)
    assert pattern_spec("no_such_pattern").eager_ops == ()


def test_a_rewrite_is_predicted_to_save_no_more_than_the_step_spends_above_its_floor():
    from trainbridge.profile.floor import FloorSummary

    spec = PATTERNS["rms_norm"]
    ops = [OpRow(name=n, calls_per_step=1, self_ms_per_step=2.0, share=0.03, kind="elementwise/reduction")
           for n in spec.eager_ops]
    floor = FloorSummary(step_ms=70.0, floor_ms=66.0, matrix_ms=50.0, elementwise_ms=15.0, step_over_floor=70 / 66,
                         above_floor_ms={"matrix": 3.0, "elementwise": 0.5, "other operators": 0.25,
                                         "outside operators": 0.25})
    profile = ProfileReport.model_construct(all_ops=ops, top_ops=ops, outside_ops_ms_per_step=0.25,
                                            op_self_ms_per_step=60.0, gemm_share=0.8, floor=floor)
    # without the floor it would be 2 ms a norm op; above the floor, outside matrix kernels, there is 1 ms
    assert predicted_saving_ms("rms_norm", profile) == pytest.approx(1.0)
    # a precision change moves the floor itself: not capped by it
    assert predicted_saving_ms("precision", profile) == pytest.approx(
        predicted_saving_ms("precision", profile.model_copy(update={"floor": None})))


def test_every_target_row_builds_its_target_and_names_its_own_device():
    for name in TARGET_NAMES:
        spec = target_spec(name)
        assert spec.name == name and TARGETS[name] is spec
        target = get_target(name)  # imports nothing device-specific until asked to check
        assert target.name == name
    assert [s.name for s in TARGETS.values() if s.source_device] == ["cuda"]
    assert [s.name for s in TARGETS.values() if s.measured_here] == ["cpu"]
    with pytest.raises(ValueError, match="choose one of cpu, cuda, npu"):
        target_spec("tpu")


def test_an_ascend_profile_finding_names_the_registry_pattern_of_its_suggestion():
    from trainbridge.profile.ascend import AFFINITY, FUSED_OPTIMIZER, analyse_ascend
    from trainbridge.targets import npu_catalog

    for operator in [sugg for _, _, sugg in AFFINITY] + list(FUSED_OPTIMIZER.values()):
        assert npu_catalog.entry(operator).pattern in PATTERNS, operator
    report = analyse_ascend(FIXTURES / "ascend" / "host_bound")
    by_rule = {f.rule: f for f in report.findings}
    assert by_rule["affinity.rms_norm"].pattern == "rms_norm"
    assert by_rule["affinity.rotary"].pattern == "rotary"
    assert all(f.pattern in PATTERNS for f in report.findings if f.pattern is not None)


def test_the_models_prompt_offers_the_registrys_operators_the_pattern_first():
    from trainbridge.agent.rewriters.llm import operator_catalog

    for target in ("cpu", "cuda"):
        text = operator_catalog(target)
        apis = {op.api for spec in PATTERNS.values() for op in spec.target_ops.get(target, ())}
        assert apis and all(f"`{api}`" in text for api in apis)
    first = operator_catalog("cpu", "attention").splitlines()[0]
    assert "scaled_dot_product_attention" in first and "attention" in first
    assert "torch_npu.npu_rms_norm" in operator_catalog("npu", "rms_norm").split("Other operators")[0]
