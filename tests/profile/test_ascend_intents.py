"""Issue 20, items 3 and 4: the npu profile's findings (ours and msprof-analyze's advisor's)
become intents the planner ranks recipes by, and the ledger names the finding a candidate answers.
The advisor's real runs are in test_ascend_real_formats.py; these need no msprof-analyze."""

import sys

import pytest

from tests.agent.test_combined_near_misses import _ctx
from tests.kits.paths import FIXTURES
from trainbridge.agent.candidate import Candidate
from trainbridge.agent.nodes import plan
from trainbridge.agent.programs import write_program
from trainbridge.profile import ascend as A
from trainbridge.profile.ascend import advisor as adv
from trainbridge.profile.ascend.intents import PREFIX, profile_intents

FIX = FIXTURES / "ascend"

SHEETS = {
    "problems": [["category", "description", "suggestion"],
                 ["Affinity API Issues", "1 fused API can replace the operators", "use it"],
                 ["Operator Dynamic Shape Issues", "dynamic shapes found", "static shapes"]],
    "Affinity API Issues": [["Affinity API", "Code stacks", "Stack called counts"],
                            ["torch_npu.npu_rms_norm",
                             "/usr/lib/python3/site-packages/torch/nn/modules/module.py(1500): _call_impl\n"
                             "/home/u/gpt/model.py(41): forward", "24"],
                            ["torch_npu.npu_unknown_op", "", "1"]],
}


def test_the_advisors_workbook_becomes_findings_with_patterns_and_user_lines():
    found = adv.findings_of(SHEETS)
    rms, unknown, *problems = found
    assert rms.rule == "msprof-analyze.affinity_api" and rms.source == "msprof-analyze"
    assert rms.suggestion == "npu_rms_norm" and rms.pattern == "rms_norm" and rms.source_lines == ["model.py:41"]
    assert unknown.pattern is None  # an API our catalog does not know joins no pattern
    assert [p.rule for p in problems] == ["msprof-analyze.affinity_api_issues",
                                          "msprof-analyze.operator_dynamic_shape_issues"]


def test_without_msprof_analyze_there_is_no_advisor_report(monkeypatch):
    monkeypatch.delenv(adv.ENV, raising=False)
    monkeypatch.setattr(adv.shutil, "which", lambda name: None)
    monkeypatch.setattr(adv.importlib.util, "find_spec", lambda name: None)
    assert adv.advisor_command() is None
    assert adv.run_advisor(FIX / "host_bound", "unused") is None


def test_an_advisor_that_fails_is_a_report_with_its_exit_code_not_an_exception(tmp_path):
    rep = adv.run_advisor(FIX / "host_bound", tmp_path / "out",
                          command=[sys.executable, "-c", "import sys; print('broken install'); sys.exit(3)"])
    assert rep.returncode == 3 and rep.findings == [] and "no workbook" in rep.note and "broken install" in rep.note
    assert (tmp_path / "out" / "advisor.log").read_text().strip() == "broken install"


def test_our_findings_with_a_pattern_become_intents_naming_the_operator_and_lines():
    r = A.analyse_ascend(FIX / "host_bound")
    intents = profile_intents(r.model_dump(mode="json"))
    with_pattern = [f for f in r.findings if f.pattern]
    assert len(intents) == len(with_pattern) > 0
    for i, f in zip(intents, with_pattern):
        assert i["id"].startswith(PREFIX) and i["id"].endswith(f.rule) and i["pattern"] == f.pattern
        assert i["source"] == "trainbridge" and f.rule in i["summary"]
        assert all(line in i["summary"] for line in f.source_lines)
    assert profile_intents(None) == []


RMS_PROGRAM = """import torch


def norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
"""


@pytest.mark.parametrize("target, from_profile", [("npu", True), ("cpu", False)])
def test_the_npu_plan_takes_its_intent_from_the_profile(tmp_path, target, from_profile):
    r = A.analyse_ascend(FIX / "host_bound")
    rms = [f for f in r.findings if f.pattern == "rms_norm"]
    assert rms, "the host_bound fixture shows an rms_norm affinity pattern"
    ctx = _ctx(tmp_path, [])
    ctx.cfg.target = target
    prof = ctx.profile()
    prof.ascend = r.model_dump(mode="json")
    ctx.profile = lambda: prof
    write_program(tmp_path / "incumbent", {"m.py": RMS_PROGRAM})
    items, tried = [], []
    for _ in range(20):  # every item the planner would try, in its order
        out = plan({"incumbent_dir": str(tmp_path / "incumbent"), "n_candidates": 0, "tried": tried},
                   type("R", (), {"context": ctx}))
        if out.get("current") is None:
            break
        items.append(Candidate.model_validate(out["current"]).item)
        tried.append(items[-1].key)
    (item,) = [i for i in items if i.pattern == "rms_norm"]
    if from_profile:
        assert item.intent_id.startswith(PREFIX) and rms[0].rule in item.intent_summary, item
    else:
        assert not (item.intent_id or "").startswith(PREFIX)
