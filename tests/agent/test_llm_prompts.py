"""Prompt templates, their loader, the source windows and answer parsing of the LLM rewriter."""

from __future__ import annotations

import json
import re

import pytest

from trainbridge.agent.planner import Hypothesis, PlanItem
from trainbridge.agent.rewriters.llm import (
    ANSWER_SCHEMA, AnswerError, LLMAnswer, LLMRewriter, load_prompt, operator_catalog, parse_answer,
    prompts_dir, render_prompt,
)

ANSWER = {"intent_addressed": "i1", "mechanism": "m", "level": "L2",
          "hypothesis": {"ops_removed": ["aten::pow"], "predicted_saving_pct": 3, "reject_if": "r"},
          "recipe": None, "edits": [{"file": "a.py", "search": "x", "replace": "y"}]}


def item(site=None, recipe="rms_norm_fused") -> PlanItem:
    return PlanItem(key="k", recipe=recipe, pattern="rms_norm", level="L2", gap_class="fusion", site=site,
                    intent_id="i1", intent_summary="fused norm", confidence=0.5, score=1.0,
                    hypothesis=Hypothesis(ops_removed=["aten::pow"], predicted_saving_ms=1.0,
                                          predicted_saving_pct=2.0, reject_if="r"))


def test_templates_exist_and_every_placeholder_is_filled():
    for name in ("system", "rewrite", "repair"):
        text = load_prompt(name)
        assert text == load_prompt(name + ".md")
        assert re.findall(r"\$(\w+)", text), name
    sysmsg = render_prompt("system", target="npu")
    for rule in ("One mechanism", "protected", "seeds", "try/except", "JSON object only"):
        assert rule in sysmsg
    with pytest.raises(KeyError):
        render_prompt("rewrite", target="cpu")  # a missing value is an error, not a blank


def test_prompts_env_var(tmp_path, monkeypatch):
    (tmp_path / "system.md").write_text("custom $target")
    monkeypatch.setenv("TRAINBRIDGE_PROMPTS", str(tmp_path))
    assert prompts_dir() == tmp_path and render_prompt("system", target="cpu") == "custom cpu"
    monkeypatch.setenv("TRAINBRIDGE_PROMPTS", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="TRAINBRIDGE_PROMPTS"):
        load_prompt("system")


def test_parse_answer_variants():
    assert parse_answer(json.dumps(ANSWER)).edits[0].replace == "y"
    assert parse_answer("Sure.\n```json\n" + json.dumps(ANSWER) + "\n```").level == "L2"
    assert parse_answer("blah " + json.dumps(ANSWER) + " trailing").intent_addressed == "i1"
    assert parse_answer(json.dumps({**ANSWER, "level": "L4 (compile)", "recipe": "null"})).level == "L4"
    assert parse_answer(json.dumps({**ANSWER, "recipe": "null"})).recipe is None
    with pytest.raises(AnswerError, match="no JSON object"):
        parse_answer("I cannot help with that.")
    with pytest.raises(AnswerError, match="schema"):
        parse_answer(json.dumps({**ANSWER, "level": "fast"}))
    with pytest.raises(AnswerError, match="empty"):
        parse_answer("")


def test_schema_matches_the_model():
    assert set(ANSWER_SCHEMA["required"]) <= set(LLMAnswer.model_fields)
    assert ANSWER_SCHEMA["properties"]["hypothesis"]["required"] == ["ops_removed", "predicted_saving_pct",
                                                                       "reject_if"]


def _big_program(n_filler=600) -> str:
    filler = "".join(f"CONST_{i} = {i}\n" for i in range(n_filler))
    return ("import torch\n\n" + filler +
            "\n\nclass Block:\n    def norm(self, x):\n        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)\n"
            + "".join(f"TAIL_{i} = {i}\n" for i in range(300)))


def test_large_files_are_shown_as_windows_around_the_site():
    rw = LLMRewriter("m", base_url="http://127.0.0.1:9/v1", window_margin=5)
    files = {"train.py": _big_program()}
    text = rw._rewrite_prompt(item(site="Block.norm"), files, "cpu", {})
    assert "def norm(self, x):" in text and "import torch" in text
    assert "CONST_300 = 300" not in text and "TAIL_200 = 200" not in text
    assert "not shown" in text and "windows" in text
    # without a site, the recipe's own site finder picks the window
    text2 = rw._rewrite_prompt(item(site=None), files, "cpu", {})
    assert "def norm(self, x):" in text2 and "CONST_300 = 300" not in text2
    # intent spans (file:line) open windows too
    line = files["train.py"].splitlines().index("CONST_300 = 300") + 1
    text3 = rw._rewrite_prompt(item(site="Block.norm"), files, "cpu", {"intent": {"spans": [f"train.py:{line}"]}})
    assert "CONST_300 = 300" in text3
    # ... and so do the evidence bundle's own spans (an Intent's SourceSpan: start_line / end_line), as the
    # graph matcher writes them for a whole attention (first product to second)
    from trainbridge.evidence.bundle import SourceSpan
    span = SourceSpan(file="train.py", start_line=line, end_line=line + 1, function="forward")
    text4 = rw._rewrite_prompt(item(site="Block.norm"), files, "cpu", {"intent": {"spans": [span.model_dump()]}})
    assert "CONST_300 = 300" in text4 and "CONST_301 = 301" in text4


def test_small_files_whole_and_profile_and_history():
    from trainbridge.profile.analysis import OpRow, ProfileReport, StepTimes

    prof = ProfileReport(
        workload="w", target="cpu", profile_steps=3, trace_path=None,
        step=StepTimes(n=5, median_ms=12.5, mean_ms=12.6, p10_ms=12.0, p90_ms=13.0, min_ms=11.9, max_ms=13.1,
                       rel_spread=0.08, raw_ms=[12.5] * 5, warmup_ms=[]),
        op_self_ms_per_step=10.0, outside_ops_ms_per_step=2.5, outside_ops_share=0.2, gemm_share=0.6,
        elementwise_share=0.4, communication_share=0.0, verdict="compute-bound", evidence=["GEMM 60 %"],
        top_ops=[OpRow(name="aten::mm", calls_per_step=12, self_ms_per_step=6.0, share=0.6, kind="gemm")])
    rw = LLMRewriter("m", base_url="http://127.0.0.1:9/v1")
    text = rw._rewrite_prompt(item(), {"train.py": "import torch\nx = 1\n", "README.md": "hi"}, "cpu",
                              {"profile": prof, "history": ["c01 sdpa: loss diverged"]})
    assert "## train.py (whole file, 2 lines)" in text and "README.md" not in text
    assert "median 12.50 ms" in text and "compute-bound" in text and "aten::mm" in text
    assert "- c01 sdpa: loss diverged" in text


def test_operator_catalog_per_target():
    assert "scaled_dot_product_attention" in operator_catalog("cpu")
    assert "fused=True" in operator_catalog("cuda")
    npu = operator_catalog("npu", "rms_norm")
    assert "npu_rms_norm" in npu and "epsilon" in npu
