"""`collect_workload` error handling (the nanogpt end-to-end run is in test_evidence_plugin.py)."""

import pytest

from trainbridge.evidence.collect import CollectError, collect_workload
from trainbridge.workload import load_workload


def _workload(root, program: str):
    root.mkdir()
    (root / "train.py").write_text(program)
    (root / "trainbridge.toml").write_text(
        'name = "broken"\nentry = "train.py"\neditable = ["train.py"]\nnative_device = "cpu"\n'
        "[work]\nper_step = 1\n")
    return load_workload(root)


def test_a_crashing_program_raises_collect_error_with_its_message(tmp_path):
    wl = _workload(tmp_path / "broken", "raise RuntimeError('no data here')\n")
    with pytest.raises(CollectError, match=r"broken.*crashed.*no data here"):
        collect_workload(wl, device="cuda", out_dir=tmp_path / "out")


def test_a_program_without_training_steps_raises(tmp_path):
    wl = _workload(tmp_path / "idle", "print('hello')\n")
    with pytest.raises(CollectError, match=r"status (no_steps|finished_early)"):
        collect_workload(wl, device="cpu", out_dir=tmp_path / "out")


def test_unknown_device_is_refused(tmp_path):
    wl = _workload(tmp_path / "x", "pass\n")
    with pytest.raises(ValueError, match="cuda or cpu"):
        collect_workload(wl, device="npu", out_dir=tmp_path / "out")
