"""The harness on the real workload: the GPU program runs ported, unmodified, on the cpu target."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainbridge.harness.runner import run_workload
from trainbridge.workload import load_workload

from tests.kits.paths import WORKLOADS

NANOGPT = WORKLOADS / "nanogpt"


@pytest.fixture(scope="module")
def nanogpt_run(tmp_path_factory):
    wl = load_workload(NANOGPT)
    out = tmp_path_factory.mktemp("nanogpt")
    return run_workload(wl, "cpu", out_dir=out, warmup_steps=3, measured_steps=17, count_flops=True)


def test_loss_falls_exact_steps_warmup_excluded(nanogpt_run):
    r = nanogpt_run
    assert r.status == "ok", r.error
    phases = [s.phase for s in r.steps]
    assert phases == ["warmup"] * 3 + ["measured"] * 17 + ["count_flops"]
    assert len(r.measured_ms) == 17 and len(r.warmup_ms) == 3
    losses = [s.loss for s in r.steps]
    assert losses[0] > 5.0 and max(losses[-5:]) < losses[0] - 1.5  # ln(256) = 5.5 at the start
    assert r.optimizers_per_step == 2  # Muon + AdamW are one step
    assert all(s.work_items == 2048 for s in r.steps)  # batch 8 x seq 256, as the manifest says
    assert r.flops_per_step > 1e9
    # the program's own log lines were read too (its first 10 steps are untimed, like the records)
    assert [l.step for l in r.program_log][:3] == [1, 2, 3]
    assert all(l.train_loss is not None for l in r.program_log)


def test_profile_command_prints_verdict_and_writes_files(tmp_path):
    out = tmp_path / "prof"
    proc = subprocess.run(
        [sys.executable, "-m", "trainbridge.cli", "profile", str(NANOGPT), "--target", "cpu", "-o", str(out),
         "--measured", "5", "--profile-steps", "2"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "160"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "verdict" in proc.stdout
    report = json.loads((out / "profile.json").read_text())
    assert report["verdict"] in ("host-bound", "compute-bound", "memory-bound", "communication-bound", "unknown")
    assert report["ops_per_step"] > 500 and len(report["step"]["raw_ms"]) == 5
    assert 0.0 < report["gemm_share"] < 1.0
    assert Path(report["trace_path"]).stat().st_size > 10_000
    names = {o["name"] for o in report["top_ops"]}
    assert "aten::mm" in names or "aten::bmm" in names or "aten::addmm" in names
