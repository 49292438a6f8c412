"""The torch_npu catalog: loads, is consistent with the references, and carries its caveats."""

from __future__ import annotations

import inspect
import typing

import pytest

from trainbridge import npu_reference
from trainbridge.patterns import Pattern
from trainbridge.targets import npu_catalog as cat

REQUIRED = {
    "npu_rms_norm", "npu_add_rms_norm", "npu_rotary_mul", "npu_fusion_attention", "npu_swiglu", "npu_geglu",
    "npu_gelu", "npu_fast_gelu", "npu_scaled_masked_softmax", "npu_confusion_transpose", "npu_cross_entropy_loss",
    "npu_format_cast", "NpuFusedAdamW", "NpuFusedAdam", "NpuFusedSGD", "npu_apply_adam_w",
    "TASK_QUEUE_ENABLE", "CPU_AFFINITY_CONF", "PYTORCH_NPU_ALLOC_CONF", "allow_hf32", "set_compile_mode",
    "allow_internal_format", "ACLNN_CACHE_LIMIT", "HOST_CACHE_CAPACITY", "ASCEND_LAUNCH_BLOCKING", "torchair",
}


def test_every_entry_loads_and_names_are_unique():
    entries = cat.load_catalog()
    names = [e.name for e in entries]
    assert len(names) == len(set(names))
    assert REQUIRED <= set(names)
    assert all(not e.verified_on_npu for e in entries)  # nothing here ran on an NPU
    assert all(e.source for e in entries)
    assert set(typing.get_args(Pattern)) >= {e.pattern for e in entries}


def _code_params(obj):
    sig = inspect.signature(obj)
    return [(p.name, p.kind == p.KEYWORD_ONLY, p.default) for p in sig.parameters.values()]


@pytest.mark.parametrize("e", [e for e in cat.load_catalog() if e.kind != "knob"], ids=lambda e: e.name)
def test_reference_has_the_documented_signature(e):
    ref = getattr(npu_reference, e.reference)
    documented = cat.parse_signature(e.signature)
    code = _code_params(ref)
    assert [p.name for p in documented] == [c[0] for c in code], "parameter names differ"
    assert [p.keyword_only for p in documented] == [c[1] for c in code], "keyword-only markers differ"
    for p, (_, _, default) in zip(documented, code):
        want = cat.literal_default(p.default)
        if want is cat._REQUIRED:
            assert default is inspect.Parameter.empty, f"{p.name} is required in the docs"
        elif want is not cat._NOTATION:
            assert default == want, f"default of {p.name}: documented {p.default}, reference {default!r}"


def test_parse_signature_handles_schema_types_and_keyword_only():
    ps = cat.parse_signature("f(Tensor? pse=None, int[]? prefix=None, *, out=(var, m, v)) -> (Tensor, int)")
    assert [(p.name, p.keyword_only, p.default) for p in ps] == [
        ("pse", False, "None"), ("prefix", False, "None"), ("out", True, "(var, m, v)")]


def test_entry_lookup_and_for_pattern():
    assert cat.entry("npu_fusion_attention").pattern == "attention"
    assert {e.name for e in cat.for_pattern("attention")} == {"npu_fusion_attention", "npu_scaled_masked_softmax"}
    assert {e.name for e in cat.for_pattern("optimizer_update")} >= {"NpuFusedAdamW", "npu_apply_adam_w"}
    assert cat.entry("npu_add_rms_norm").has_backward is False
    with pytest.raises(KeyError, match="known"):
        cat.entry("npu_flash_attention")


def test_render_for_prompt_has_signatures_and_every_caveat():
    entries = cat.load_catalog()
    text = cat.render_for_prompt(entries)
    for e in entries:
        assert e.signature in text
        for c in e.caveats:
            assert c in text
    fa = cat.render_for_prompt([cat.entry("npu_fusion_attention")])
    assert "True (1) = masked OUT" in fa and "scale defaults to 1.0" in fa and "take [0]" in fa
    assert "NO backward" in cat.render_for_prompt([cat.entry("npu_add_rms_norm")])
    assert "set_to_none=True) raises" in cat.render_for_prompt([cat.entry("NpuFusedAdamW")])
    rot = cat.render_for_prompt([cat.entry("npu_rotary_mul")])
    assert "4-D" in rot and "< 896" in rot


def test_catalog_rejects_inconsistent_entries():
    good = cat.entry("npu_swiglu").model_dump()
    with pytest.raises(ValueError, match="reference"):
        cat.CatalogEntry(**{**good, "reference": None})
    with pytest.raises(ValueError):
        cat.CatalogEntry(**{**good, "pattern": "not_a_pattern"})
