"""The agent loop end to end on the minigpt fixture, killed -9 at every node and resumed:
the run still finishes, once, with its ledger, decisions, reports and final program.

One run of the minigpt fixture (one candidate) is killed (SIGKILL to its process group) as soon as a kind
of ledger event it has not been killed after appears, resumed from the command line, and
killed again at the next new kind, until it finishes. Every kind of event the loop writes
is a kill point: run start, port, baseline, evidence, proposal, validation, measurement,
decision.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainbridge.ledger import models as ev
from trainbridge.ledger.store import Ledger

from tests.kits.paths import FIXTURES

MINIGPT = FIXTURES / "loop" / "minigpt"
KILL_AFTER = ("run_started", "port_applied", "baseline_measured", "evidence_loaded", "candidate_proposed",
              "candidate_validated", "candidate_measured", "candidate_decided")


def _kinds(run_dir: Path | None) -> list[str]:
    if run_dir is None or not (run_dir / "ledger.jsonl").exists():
        return []
    return [e.event for e in Ledger(run_dir / "ledger.jsonl").events()]


def _run_until_new_kind(cmd: list[str], cwd: Path, runs: Path, killed: set[str], timeout_s: float = 300):
    """Start `cmd`; SIGKILL it once an event kind outside `killed` appears. Returns (kind, run dir)."""
    dirs = sorted(runs.glob("*")) if runs.exists() else []
    seen = len(_kinds(dirs[0] if dirs else None))  # only what this process writes counts
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            time.sleep(0.2)
            dirs = sorted(runs.glob("*")) if runs.exists() else []
            kinds = _kinds(dirs[0] if dirs else None)[seen:]
            new = next((k for k in kinds if k in KILL_AFTER and k not in killed), None)
            if new is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return new, dirs[0]
            if proc.poll() is not None:
                assert proc.returncode == 0, proc.stderr.read().decode()[-3000:]
                return None, dirs[0] if dirs else None
        raise AssertionError(f"nothing new in {timeout_s:.0f} s: {cmd}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_run_killed_after_every_kind_of_event_resumes_to_one_finish(tmp_path):
    runs = tmp_path / "runs"
    cli = [sys.executable, "-m", "trainbridge.cli", "run"]
    cmd = cli + [str(MINIGPT), "--budget", "1", "--pairs", "1", "--looks", "1", "--baseline-runs", "4",
                 "--skip-collect",
                 "--allow-no-evidence", "--no-compile-compare", "--runs-root", str(runs)]
    killed: set[str] = set()
    run_dir = None
    for _ in range(2 * len(KILL_AFTER) + 2):
        kind, run_dir = _run_until_new_kind(cmd, tmp_path, runs, killed)
        if kind is None:
            break
        killed.add(kind)
        cmd = cli + ["--resume", str(run_dir)]
    events = list(Ledger(run_dir / "ledger.jsonl").events())
    kinds = [e.event for e in events]
    assert kinds.count("run_finished") == 1, kinds
    # a kind written moments before the next (a decision right after its measurement) may be passed by
    assert {"run_started", "baseline_measured", "candidate_proposed", "candidate_validated"} <= killed, killed
    assert len(killed) >= 5, killed
    assert kinds.count("run_resumed") == len(killed), (kinds, killed)
    decided = [e.candidate_id for e in events if isinstance(e, ev.CandidateDecided)]
    proposed = [e.candidate_id for e in events if isinstance(e, ev.CandidateProposed)]
    assert decided and len(decided) == len(set(decided)), decided
    assert len(proposed) == len(set(proposed)), f"a candidate was proposed twice: {proposed}"
    assert kinds.count("baseline_measured") == 1 and kinds.count("port_applied") == 1, kinds
    # what the finished run leaves for review
    fin = next(e for e in events if isinstance(e, ev.RunFinished))
    assert fin.final_speedup is not None and (run_dir / "final" / "vs_port.diff").exists()
    base = next(e for e in events if isinstance(e, ev.BaselineMeasured))
    assert len(base.runs_ms) == 4 and 0.0 <= base.aa.false_accept_rate <= 1.0
    # the port's floor: its own matrix calls timed alone, under the step that contains them
    assert base.floor is not None and 0 < base.floor.matrix_ms < base.floor.step_ms, base.floor
    assert base.floor.step_over_floor > 1.0 and (run_dir / "floor" / "floor.json").exists()
    report = (run_dir / "report.md").read_text()
    assert "- floor: step " in report and "final step against the port's floor" in report
    page = (run_dir / "report.html").read_text()  # the page a reviewer opens, written by the same node
    for cid in decided:
        assert cid in report and f"id='{cid}'" in page
    out = subprocess.run([sys.executable, "-m", "trainbridge.cli", "ledger", str(run_dir)], capture_output=True,
                         text=True, cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0 and decided[0] in out.stdout
    assert json.loads((run_dir / "config.json").read_text())["budget_candidates"] == 1
