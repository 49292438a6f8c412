"""`trainbridge run --target npu --dry-run` on nanogpt: npu rewrites validated against the
torch_npu references on the CPU, recorded as validated-not-measured, never as speedups.

The program is nanogpt's own, on the tiny configuration (tests/kits/small_workloads.py): a dry
run validates every candidate with an 8-step run, and the shipped size spends minutes there."""

import subprocess
import sys

from trainbridge.ledger import models as ev
from trainbridge.ledger.store import Ledger

from tests.kits.small_workloads import small_nanogpt


def test_nanogpt_npu_dry_run(tmp_path):
    runs = tmp_path / "runs"
    work = small_nanogpt(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "trainbridge.cli", "run", str(work), "--target", "npu", "--dry-run", "--skip-collect",
         "--budget", "6", "--runs-root", str(runs)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = next(runs.iterdir())
    events = list(Ledger(run_dir / "ledger.jsonl").events())
    assert not any(isinstance(e, ev.CandidateMeasured) for e in events)  # nothing is timed in a dry run
    validated = [e.candidate_id for e in events if isinstance(e, ev.CandidateDecided)
                 and e.decision == "validated_not_measured"]
    final = "".join(p.read_text() for p in (run_dir / "final").glob("*.py"))
    for op in ("torch_npu.npu_rms_norm", "torch_npu.npu_rotary_mul", "torch_npu.npu_fusion_attention",
               "torch_npu.optim.NpuFused"):
        assert op in final, f"{op} missing from the dry-run program"
    assert len(validated) >= 4
    fin = next(e for e in events if isinstance(e, ev.RunFinished))
    assert fin.final_speedup is None  # dry-run entries are never reported as speedups
    # each validation ran against the references, and says so
    env = next(e for e in events if isinstance(e, ev.BaselineMeasured)).environment
    assert "reference" in str(env)
    # `ledger measure` needs the real target and says what is missing
    out = subprocess.run([sys.executable, "-m", "trainbridge.cli", "ledger", "measure", str(run_dir)],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "torch_npu" in out.stderr
