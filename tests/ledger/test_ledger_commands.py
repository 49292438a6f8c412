"""`trainbridge ledger show|verify|measure|compare|export` and `trainbridge runs` on ledgers
written here (two runs of one workload that accepted different things, one of another)."""

from __future__ import annotations

import csv
import io
import json

from typer.testing import CliRunner

from trainbridge.cli import app
from trainbridge.ledger import models as ev
from trainbridge.ledger.compare import compare_runs, mechanism_key
from trainbridge.ledger.store import Ledger
from trainbridge.measure.statistics import compare

from tests.ledger.test_ledger import CAND, HYP, INC

FAST = compare(INC, CAND, n_boot=200)  # about 1.1x
SAME = compare(INC, INC, n_boot=200)


def _run(root, run_id, *, workload="minigpt", target="cpu", decisions=(), final=None):
    """A finished run whose candidates are (id, decision, comparison or None) in order."""
    b = {"run_id": run_id, "time_utc": f"2026-12-0{run_id[-1]}T10:00:00.000+00:00"}
    led = Ledger(root / run_id / "ledger.jsonl")
    led.append(ev.RunStarted(**b, workload=f"/w/{workload}", workload_name=workload, target=target, agent="recipes",
                             budget_candidates=4, budget_minutes=5.0, argv=["trainbridge", "run"]))
    for cid, decision, comp in decisions:
        led.append(ev.CandidateProposed(**b, candidate_id=cid, pattern="p", level="L1", gap_class="fusion",
                                        source="recipe:x", mechanism="m", hypothesis=ev.HypothesisRecord(**HYP),
                                        diff="@@", files=["train.py"]))
        led.append(ev.CandidateValidated(**b, candidate_id=cid, passed=comp is not None,
                                         stage="work" if comp is not None else "correctness",
                                         reason="ok" if comp is not None else "loss 3% off at step 3"))
        if comp is not None:
            led.append(ev.CandidateMeasured(**b, candidate_id=cid, incumbent_runs_ms=INC, candidate_runs_ms=CAND,
                                            comparison=comp))
        led.append(ev.CandidateDecided(**b, candidate_id=cid, decision=decision, reason=f"{decision} by the rule"))
    acc = [c for c, d, _ in decisions if d == "accepted"]
    led.append(ev.RunFinished(**b, final_speedup=final.speedup if final else None,
                              final_ci=(final.ci_low, final.ci_high) if final else None, accepted=acc,
                              rejected=[c for c, d, _ in decisions if d == "rejected"],
                              end_to_end=ev.EndToEnd(final_vs_port=final)))
    return root / run_id


def _two_runs(tmp_path):
    a = _run(tmp_path, "run-1", decisions=[("c01-fused_optimizer", "accepted", FAST),
                                          ("c02-sdpa_attention", "rejected", SAME)], final=FAST)
    b = _run(tmp_path, "run-2", decisions=[("c01-sdpa_attention", "rejected", None),
                                          ("c02-sdpa_attention-r1", "accepted", FAST),
                                          ("c03-gelu_fused", "rejected", SAME)], final=FAST)
    return a, b


def test_mechanism_key_drops_the_counter_and_the_repair_suffix():
    assert mechanism_key("c03-sdpa_attention-r1") == "sdpa_attention"
    assert mechanism_key("c12-compile_region-RMSNorm") == "compile_region-RMSNorm"
    assert mechanism_key("port") == "port"


def test_compare_lines_up_mechanisms_and_a_repair_speaks_for_its_mechanism(tmp_path):
    a, b = _two_runs(tmp_path)
    cmp = compare_runs(a, b)
    rows = {r.mechanism: r for r in cmp.rows}
    assert list(rows) == ["fused_optimizer", "sdpa_attention", "gelu_fused"]
    assert rows["fused_optimizer"].a.decision == "accepted" and rows["fused_optimizer"].b is None
    # run B tried attention twice; its repaired attempt was accepted, run A rejected it
    assert rows["sdpa_attention"].a.decision == "rejected" and rows["sdpa_attention"].b.decision == "accepted"
    assert rows["sdpa_attention"].b.candidate_id == "c02-sdpa_attention-r1" and not rows["sdpa_attention"].agree
    assert rows["gelu_fused"].a is None
    assert cmp.a.accepted == ["c01-fused_optimizer"] and cmp.b.accepted == ["c02-sdpa_attention-r1"]
    assert "faster than the port" in cmp.a.verdict


def test_compare_command_prints_both_sides_and_refuses_runs_of_other_workloads(tmp_path):
    a, b = _two_runs(tmp_path)
    out = CliRunner().invoke(app, ["ledger", "compare", str(a), str(b)], env={"COLUMNS": "220"})
    assert out.exit_code == 0, out.output
    assert "fused_optimizer" in out.output and "gelu_fused" in out.output
    assert out.output.count("accepted") >= 2 and "A: final program" in out.output and "B: final program" in out.output
    other = _run(tmp_path, "run-3", workload="capgpt")
    bad = CliRunner().invoke(app, ["ledger", "compare", str(a), str(other)])
    assert bad.exit_code == 2 and "one workload" in bad.output and "Traceback" not in bad.output
    gpu = _run(tmp_path, "run-4", target="cuda")
    bad = CliRunner().invoke(app, ["ledger", "compare", str(a), str(gpu)])
    assert bad.exit_code == 2 and "one target" in bad.output


def test_export_csv_and_json_carry_every_candidate_with_its_run(tmp_path):
    _, b = _two_runs(tmp_path)
    out = CliRunner().invoke(app, ["ledger", "export", str(b)])
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.output)))
    assert [r["candidate_id"] for r in rows] == ["c01-sdpa_attention", "c02-sdpa_attention-r1", "c03-gelu_fused"]
    assert {r["run_id"] for r in rows} == {"run-2"} and {r["workload"] for r in rows} == {"minigpt"}
    assert rows[0]["stage"] == "correctness" and rows[0]["speedup"] == ""  # never timed
    assert abs(float(rows[1]["speedup"]) - FAST.speedup) < 1e-9 and rows[1]["decision"] == "accepted"
    target = tmp_path / "b.json"
    out = CliRunner().invoke(app, ["ledger", "export", str(b), "--format", "json", "-o", str(target)])
    assert out.exit_code == 0, out.output
    data = json.loads(target.read_text())
    assert len(data) == 3 and data[1]["ci_low"] == FAST.ci_low and data[0]["reason"] == "rejected by the rule"
    bad = CliRunner().invoke(app, ["ledger", "export", str(b), "--format", "xml"])
    assert bad.exit_code == 2 and "xml" in bad.output


def test_runs_lists_every_run_and_a_damaged_one_with_its_reason(tmp_path):
    _two_runs(tmp_path)
    broken = _run(tmp_path, "run-5", workload="capgpt")
    lines = (broken / "ledger.jsonl").read_text().splitlines()
    lines[0] = lines[0][: len(lines[0]) // 2]  # a damaged first line: not a crash's torn last line
    (broken / "ledger.jsonl").write_text("\n".join(lines) + "\n")
    out = CliRunner().invoke(app, ["runs", str(tmp_path)], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    for name in ("run-1", "run-2", "run-5"):
        assert name in out.output
    assert "ledger unreadable" in out.output and "faster than the port" in out.output
    missing = CliRunner().invoke(app, ["runs", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "not a folder" in missing.output


def test_ledger_sub_commands_and_the_old_spelling(tmp_path):
    a, _ = _two_runs(tmp_path)
    for argv in (["ledger", "show", str(a)], ["ledger", str(a)]):
        out = CliRunner().invoke(app, argv, env={"COLUMNS": "220"})
        assert out.exit_code == 0, out.output
        assert "c01-fused_optimizer" in out.output
    helped = CliRunner().invoke(app, ["ledger", "--help"], env={"COLUMNS": "200"})
    for word in ("show", "verify", "measure", "compare", "export"):
        assert word in helped.output
    # verify needs 3 rounds at least, refused before anything is measured
    few = CliRunner().invoke(app, ["ledger", "verify", str(a), "--pairs", "2"])
    assert few.exit_code == 2 and "--pairs" in few.output
    nowhere = CliRunner().invoke(app, ["ledger", "show", str(tmp_path / "none")])
    assert nowhere.exit_code == 2 and "not a run folder" in nowhere.output


def test_mlflow_export_logs_the_run_and_one_nested_run_per_candidate(tmp_path):
    import pytest

    mlflow = pytest.importorskip("mlflow", reason="the [mlflow] extra is not installed")
    _, b = _two_runs(tmp_path)
    store = (tmp_path / "store").as_uri()
    out = CliRunner().invoke(app, ["ledger", "export", str(b), "--format", "mlflow", "--tracking-uri", store])
    assert out.exit_code == 0, out.output
    client = mlflow.tracking.MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name("trainbridge-minigpt")
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if r.info.run_name == "run-2")
    assert parent.data.params["target"] == "cpu" and parent.data.metrics["accepted"] == 1
    assert abs(parent.data.metrics["final_speedup"] - FAST.speedup) < 1e-9
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert set(children) == {"c01-sdpa_attention", "c02-sdpa_attention-r1", "c03-gelu_fused"}
    assert children["c02-sdpa_attention-r1"].data.params["decision"] == "accepted"
    assert "speedup" not in children["c01-sdpa_attention"].data.metrics  # never timed
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"ledger.jsonl"}


def test_mlflow_export_without_mlflow_says_how_to_get_it(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mlflow(name, *a, **kw):
        if name == "mlflow" or name.startswith("mlflow."):
            raise ImportError("No module named 'mlflow'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_mlflow)
    _, b = _two_runs(tmp_path)
    out = CliRunner().invoke(app, ["ledger", "export", str(b), "--format", "mlflow"])
    assert out.exit_code == 2 and "trainbridge[mlflow]" in out.output
