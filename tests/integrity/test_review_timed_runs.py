"""The post-run commands check every timed round as the loop does.

`ledger measure` times a dry run's candidates on the real target and `ledger verify` re-times
a finished run's final program. A program that behaves while it is validated and does less
work whenever it is not (the realistic attack: it reads the harness request on its command
line) must be refused by both, not timed into a speedup. The run folders are built here the
way the loop writes them, and timed on the cpu.
"""

from pathlib import Path

import pytest

from trainbridge.agent.programs import write_program
from trainbridge.agent.rewriters.base import Proposal
from trainbridge.agent.state import RunConfig, RunPaths
from trainbridge.harness.runner import port_sources
from trainbridge.ledger import models as ev
from trainbridge.ledger.store import Ledger
from trainbridge.measure.acceptance import Rule
from trainbridge.review.measure_dry import measure_dry_run
from trainbridge.review.verify import verify_run
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES

MINIGPT = FIXTURES / "loop" / "minigpt"
FILE = "train.py"
CHEAT = ("        x, y = get_batch(gen)\n",
         "        x, y = get_batch(gen)\n"
         "        if b'validate' not in open('/proc/self/cmdline', 'rb').read():\n"
         "            x, y = x[:2], y[:2]\n")


@pytest.fixture(scope="module")
def port():
    files, _ = port_sources(load_workload(MINIGPT), "cpu")
    assert CHEAT[0] in files[FILE]
    return files


def _cheat(port):
    return {**port, FILE: port[FILE].replace(*CHEAT, 1)}


def _now():
    return ev.utc_now()


def _proposed(cid: str, files: list[str]) -> ev.CandidateProposed:
    return ev.CandidateProposed(
        run_id="r", time_utc=_now(), candidate_id=cid, pattern="rms_norm", level="L2", gap_class="fusion",
        source="recipe:rms_norm_fused", mechanism="fused norm", diff="", files=files, incumbent="port",
        hypothesis=ev.HypothesisRecord(predicted_saving_ms=1.0, predicted_saving_pct=1.0, reject_if="no gain"))


def _dry_run(tmp: Path, port: dict, candidates: dict[str, dict]) -> Path:
    paths = RunPaths(tmp / "run")
    paths.root.mkdir(parents=True)
    paths.config.write_text(RunConfig(run_id="r", workload=str(MINIGPT), target="npu", dry_run=True).model_dump_json())
    write_program(paths.baseline_dir, port)
    ledger = Ledger(paths.ledger)
    for cid, files in candidates.items():
        write_program(paths.candidate_dir(cid) / "program", files)
        (paths.candidate_dir(cid) / "proposal.json").write_text(Proposal(
            source="recipe:rms_norm_fused", files=files, changed_files=[FILE], description="d",
            mechanism="m").model_dump_json())
        ledger.append(_proposed(cid, [FILE]))
        ledger.append(ev.CandidateDecided(run_id="r", time_utc=_now(), candidate_id=cid,
                                          decision="validated_not_measured", reason="dry run",
                                          rule=Rule.DRY_RUN_VALIDATED.value))
    return paths.root


def test_ledger_measure_refuses_a_dry_run_candidate_that_cheats_when_timed(tmp_path, port):
    run_dir = _dry_run(tmp_path, port, {"c01": _cheat(port), "c02": dict(port)})
    decisions = {d.candidate_id: d for d in measure_dry_run(run_dir, pairs=1, target="cpu")}
    assert decisions["c01"].decision == "rejected"
    assert decisions["c01"].rule == Rule.TIMED_RUN_MISMATCH.value
    assert "work items" in decisions["c01"].reason
    # the honest candidate (the port itself) is measured and decided by the interval, not refused
    assert decisions["c02"].rule != Rule.TIMED_RUN_MISMATCH.value
    measured = [e.candidate_id for e in Ledger(run_dir / "ledger.jsonl").events()
                if isinstance(e, ev.CandidateMeasured)]
    assert measured == ["c02"]


def test_ledger_verify_does_not_hold_for_a_final_program_that_cheats_when_timed(tmp_path, port):
    paths = RunPaths(tmp_path / "run")
    paths.root.mkdir(parents=True)
    paths.config.write_text(RunConfig(run_id="r", workload=str(MINIGPT), target="cpu").model_dump_json())
    write_program(paths.baseline_dir, port)
    write_program(paths.final_dir, _cheat(port))
    Ledger(paths.ledger).append(ev.RunFinished(run_id="r", time_utc=_now(), final_speedup=1.8, final_ci=(1.5, 2.1),
                                               accepted=["c01"], rejected=[]))
    result = verify_run(paths.root, pairs=3)
    assert result.holds is False and result.measured_speedup is None
    assert any("timed run" in p and "work items" in p for p in result.problems), result.problems
    assert result.port_runs_ms == [] and result.final_runs_ms == []  # the session stopped at the first round
