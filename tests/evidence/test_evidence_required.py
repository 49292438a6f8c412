"""GPU evidence is the loop's teacher: a run asked for it either has it or says loudly that it has not.

The README's own command, `trainbridge run workloads/nanogpt` from the repository root with the
default relative `--runs-root runs`, once lost its evidence: the capture plugin wrote its file
relative to the child's working directory (the program's folder) and the parent looked relative
to its own. These tests run that exact command form, and the ways a run can end up without
evidence.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from langgraph.runtime import Runtime
from typer.testing import CliRunner

from trainbridge.agent.context import RunContext
from trainbridge.agent.nodes import collect
from trainbridge.agent.state import RunConfig, RunPaths
from trainbridge.harness.models import RunRequest
from trainbridge.ledger import models as ev
from trainbridge.ledger.report import write_report_md
from trainbridge.ledger.store import Ledger
from trainbridge.ledger.summary import evidence_line
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES
from tests.kits.small_workloads import small_nanogpt

MINIGPT = FIXTURES / "loop" / "minigpt"


def _trainbridge() -> list[str]:
    exe = shutil.which("trainbridge")
    return [exe] if exe else [sys.executable, "-m", "trainbridge.cli"]


@pytest.mark.slow
def test_readme_command_from_the_repository_root_collects_and_plans_with_evidence(tmp_path):
    """`trainbridge run workloads/nanogpt` exactly as the README gives it: relative workload path,
    default relative runs root, started from the folder that holds `workloads/`."""
    (tmp_path / "workloads").mkdir()
    small_nanogpt(tmp_path / "workloads")
    proc = subprocess.run([*_trainbridge(), "run", "workloads/nanogpt", "--budget", "1", "--pairs", "1",
                           "--looks", "1", "--baseline-runs", "4", "--no-compile-compare"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = list((tmp_path / "runs").iterdir())
    bundle = json.loads((run_dir / "evidence.json").read_text())
    intent_ids = {i["id"] for i in bundle["intents"]}
    assert intent_ids, "the evidence bundle has no intents"
    events = list(Ledger(run_dir / "ledger.jsonl").events())
    loaded = next(e for e in events if isinstance(e, ev.EvidenceLoaded))
    assert loaded.source == "collected" and loaded.intents == len(intent_ids) and loaded.missing is None
    # the planner used them: the candidate it proposed names one of the bundle's intents
    proposed = [e for e in events if isinstance(e, ev.CandidateProposed)]
    assert proposed and proposed[0].intent_id in intent_ids, [p.intent_id for p in proposed]
    # nothing was written relative to a child's working directory
    assert not list(run_dir.glob("**/programs/*/runs")), "a child wrote under its own folder"
    assert f"GPU evidence: {len(intent_ids)} intents" in (run_dir / "report.md").read_text()
    assert f"GPU evidence: {len(intent_ids)} intents" in proc.stdout
    # one candidate: the other patterns' intents are listed as not taken up, each with why
    fin = next(e for e in events if isinstance(e, ev.RunFinished))
    assert fin.unrealised_intents and {u.intent_id for u in fin.unrealised_intents} <= intent_ids
    assert all(u.reason for u in fin.unrealised_intents)
    assert "## GPU intents no candidate took up" in (run_dir / "report.md").read_text()


def test_request_refuses_relative_paths_across_the_process_boundary():
    ok = dict(script="/p/train.py", cwd="/p", result_path="/r/x.json", steps_path="/r/x.steps.jsonl")
    RunRequest(**ok, plugin_options={"device": "cuda", "out": "/r/raw.json"})
    for bad in ({"cwd": "p"}, {"result_path": "runs/x.json"}, {"steps_path": "x.jsonl"},
                {"profile_trace_path": "t.json"}, {"plugin_options": {"out": "runs/e/raw.json"}},
                {"plugin_options": {"source_root": "workloads/nanogpt"}},
                {"plugin_options": {"trace_dir": "traces"}}):
        with pytest.raises(ValueError, match="must be absolute"):
            RunRequest(**{**ok, **bad})


def test_run_paths_are_absolute_whatever_the_runs_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = RunPaths(Path("runs") / "x")
    assert paths.root.is_absolute() and paths.root == tmp_path / "runs" / "x"
    assert paths.candidate_dir("c01").is_absolute() and paths.harness_dir.is_absolute()


# ---------------------------------------------------------------- the collect node ----
def _collect_node(tmp_path, **cfg):
    wl = load_workload(MINIGPT)
    config = RunConfig(run_id="t", workload=str(wl.root), **cfg)
    paths = RunPaths(tmp_path / "run")
    paths.root.mkdir(parents=True)
    ledger = Ledger(paths.ledger)
    said = []
    ctx = RunContext(cfg=config, workload=wl, paths=paths, ledger=ledger, rewriter=None,
                     report=lambda phase, **kw: said.append(kw))
    collect({}, Runtime(context=ctx))
    (loaded,) = [e for e in ledger.events() if isinstance(e, ev.EvidenceLoaded)]
    return loaded, said, paths, ledger


def _failing_collect(*a, **k):
    from trainbridge.evidence.collect import CollectError

    raise CollectError("evidence collection for minigpt failed: the capture plugin wrote nothing")


def test_a_failed_collection_is_recorded_as_missing_and_said_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr("trainbridge.evidence.collect.collect_workload", _failing_collect)
    loaded, said, paths, ledger = _collect_node(tmp_path)
    assert loaded.required and loaded.intents == 0 and loaded.source == "collected"
    assert "capture plugin wrote nothing" in loaded.missing
    assert any("NO GPU EVIDENCE" in kw.get("warning", "") for kw in said)
    # report.md: under the verdict, in bold
    report = write_report_md(paths.root, ledger).read_text().splitlines()
    verdict = next(i for i, line in enumerate(report) if line.startswith("**Verdict:**"))
    assert "NO GPU EVIDENCE" in "\n".join(report[verdict + 1: verdict + 3])


def test_allow_no_evidence_and_skip_collect_make_a_run_without_evidence_legitimate(tmp_path, monkeypatch):
    monkeypatch.setattr("trainbridge.evidence.collect.collect_workload", _failing_collect)
    loaded, said, *_ = _collect_node(tmp_path / "a", allow_no_evidence=True)
    assert not loaded.required and loaded.missing is None and "allowed by --allow-no-evidence" in evidence_line(loaded)
    assert not any(kw.get("warning") for kw in said)
    loaded, said, *_ = _collect_node(tmp_path / "b", collect=False)
    assert loaded.source == "skipped" and loaded.missing is None and "--skip-collect" in evidence_line(loaded)


def test_an_empty_bundle_counts_as_no_evidence(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"route": "imported", "device": "cuda", "torch_version": "2.13.0"}))
    loaded, *_ = _collect_node(tmp_path / "r", evidence=str(empty))
    assert loaded.source == "file" and loaded.missing == "the given evidence bundle has no optimization intents"


# ---------------------------------------------------------------- the command line ----
@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not an evidence bundle trainbridge can read"),
    (json.dumps({"route": "imported", "device": "cuda", "torch_version": "2.13.0"}), "has no optimization intents"),
])
def test_a_bad_evidence_file_fails_before_the_baseline(tmp_path, monkeypatch, content, message):
    from trainbridge.cli import app

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evidence.json"
    if content is not None:
        path.write_text(content)

    def no_run(*a, **k):
        raise AssertionError("the run started")

    monkeypatch.setattr("trainbridge.agent.run.start_run", no_run)
    out = CliRunner().invoke(app, ["run", str(MINIGPT), "--evidence", str(path)])
    said = " ".join(out.output.split())  # rich wraps long lines
    assert out.exit_code == 2, said
    assert message in said and "Traceback" not in said
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_run_that_lost_its_evidence_exits_non_zero(tmp_path, monkeypatch):
    from trainbridge.cli import app
    from trainbridge.ledger.summary import EXIT_NO_EVIDENCE

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("trainbridge.evidence.collect.collect_workload", _failing_collect)
    out = CliRunner().invoke(app, ["run", str(MINIGPT), "--budget", "0", "--pairs", "1", "--baseline-runs", "4",
                                   "--no-compile-compare"])
    said = " ".join(out.output.split())
    assert out.exit_code == EXIT_NO_EVIDENCE, said
    assert "NO GPU EVIDENCE" in said
    (run_dir,) = list((tmp_path / "runs").iterdir())
    assert "**NO GPU EVIDENCE" in (run_dir / "report.md").read_text()
