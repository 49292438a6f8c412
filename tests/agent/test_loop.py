"""The agent loop end to end on the minigpt fixture: ledger, decisions, report, resume after a kill."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainbridge.agent.run import resume_run
from trainbridge.ledger import models as ev
from trainbridge.ledger.store import Ledger

from tests.kits.paths import FIXTURES

MINIGPT = FIXTURES / "loop" / "minigpt"


def _cli(*args, cwd):
    return [sys.executable, "-m", "trainbridge.cli", *args]


def _events(run_dir: Path):
    return list(Ledger(run_dir / "ledger.jsonl").events())


def test_killed_run_resumes_without_repeating_finished_candidates(tmp_path):
    runs = tmp_path / "runs"
    cmd = _cli("run", str(MINIGPT), "--budget", "2", "--pairs", "1", "--looks", "1", "--baseline-runs", "4",
               "--skip-collect",
               "--no-compile-compare", "--runs-root", str(runs), cwd=tmp_path)
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 240
    run_dir = None
    try:
        while time.time() < deadline:
            time.sleep(0.5)
            dirs = list(runs.glob("*")) if runs.exists() else []
            if dirs and (dirs[0] / "ledger.jsonl").exists():
                run_dir = dirs[0]
                if any(isinstance(e, ev.CandidateDecided) for e in _events(run_dir)):
                    break
            assert proc.poll() is None, "run ended before a candidate was decided"
        else:
            raise AssertionError("no candidate decided in time")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # a crash, not a clean stop
        proc.wait()
    before = _events(run_dir)
    decided_before = [e.candidate_id for e in before if isinstance(e, ev.CandidateDecided)]
    assert decided_before and not any(isinstance(e, ev.RunFinished) for e in before)

    resume_run(run_dir)

    after = _events(run_dir)
    decided = [e.candidate_id for e in after if isinstance(e, ev.CandidateDecided)]
    assert len(decided) == len(set(decided)), f"a candidate was decided twice: {decided}"
    assert decided[: len(decided_before)] == decided_before
    for cid in decided_before:  # finished candidates are not proposed again
        assert sum(isinstance(e, ev.CandidateProposed) and e.candidate_id == cid for e in after) == 1
    assert any(isinstance(e, ev.RunResumed) for e in after)
    fin = [e for e in after if isinstance(e, ev.RunFinished)]
    assert len(fin) == 1 and fin[0].final_speedup is not None
    assert (run_dir / "final" / "vs_port.diff").exists() and (run_dir / "report.md").exists()
    base = next(e for e in after if isinstance(e, ev.BaselineMeasured))
    assert len(base.runs_ms) == 4 and 0.0 <= base.aa.false_accept_rate <= 1.0
    report = (run_dir / "report.md").read_text()
    for cid in decided:
        assert cid in report
    # the ledger table command works on the folder
    out = subprocess.run(_cli("ledger", str(run_dir), cwd=tmp_path), capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0 and decided[0] in out.stdout
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["budget_candidates"] == 2
