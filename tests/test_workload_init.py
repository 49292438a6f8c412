"""`trainbridge init` on programs it has never seen (written here in other house styles)."""

import shutil
import subprocess
import sys

import pytest

from trainbridge.harness.runner import run_workload
from trainbridge.workload import load_workload
from trainbridge.workload_init import InitError, describe, manifest_toml, write_manifest

from tests.kits.paths import FIXTURES

CONFIGGPT = FIXTURES / "others" / "configgpt"


@pytest.fixture()
def program(tmp_path):
    folder = tmp_path / "configgpt"
    shutil.copytree(CONFIGGPT, folder)
    return folder


def test_a_config_globals_program_is_described_from_its_source_and_a_probe(program):
    result = describe(program, args=["--batch_size=4"])
    m = result.manifest
    assert m.entry == "train.py" and sorted(m.editable) == ["model.py", "train.py"]  # the configurator is not
    assert any("configurator.py" in n and "exec" in n for n in result.notes)
    region = next(r for r in m.protected if r.file == "train.py")
    assert "get_batch" in region.symbols and {"batch_size", "block_size", "seed", "learning_rate"} <= set(region.names)
    assert "data loading" in region.reason and "seeds" in region.reason
    assert any(r.file == "model.py" and "GPTConfig" in r.symbols for r in m.protected)
    # the work the harness counted: 4 sequences (--batch_size=4 reached the program) x 16 tokens
    assert m.work.unit == "tokens" and m.work.per_step == 4 * 16
    assert 5 <= m.steps.measured <= 30 and result.probe.status == "ok"


def test_the_written_manifest_loads_and_runs(program):
    result = describe(program, args=["--batch_size=4"])
    write_manifest(program, result.manifest)
    wl = load_workload(program)
    assert wl.manifest == result.manifest
    run = run_workload(wl, "cpu", out_dir=program.parent / "out", label="check", warmup_steps=1, measured_steps=2)
    assert run.status == "ok", run.error
    assert {s.work_items for s in run.steps} == {wl.manifest.work.per_step}
    with pytest.raises(InitError, match="exists"):
        write_manifest(program, result.manifest)


def test_a_probe_that_fails_is_reported_not_guessed_around(program):
    text = (program / "train.py").read_text()
    loop = "for it in range(max_iters):"
    (program / "train.py").write_text(text.replace(loop, "raise SystemExit('no data')\n" + loop))
    with pytest.raises(InitError, match="did not complete"):
        describe(program)


def test_a_folder_must_name_one_training_script(program):
    shutil.copy(program / "train.py", program / "train_other.py")
    with pytest.raises(InitError, match="several training scripts"):
        describe(program, run_probe=False)
    assert describe(program / "train.py", run_probe=False).manifest.entry == "train.py"
    empty = program.parent / "empty"
    empty.mkdir()
    (empty / "util.py").write_text("x = 1\n")
    with pytest.raises(InitError, match="no Python file here calls .backward"):
        describe(empty, run_probe=False)


def test_the_manifest_text_is_valid_toml_for_every_field(program):
    import tomllib

    m = describe(program, run_probe=False).manifest
    assert tomllib.loads(manifest_toml(m))["protected"][0]["names"] == m.protected[0].names


def test_the_command_prints_then_writes_only_when_told(program):
    cmd = [sys.executable, "-m", "trainbridge.cli", "init", str(program), "--no-probe"]
    out = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert out.returncode == 1 and "pass --write" in out.stderr and 'entry = "train.py"' in out.stdout
    assert not (program / "trainbridge.toml").exists()
    out = subprocess.run(cmd + ["--write"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and (program / "trainbridge.toml").exists(), out.stderr
    out = subprocess.run(cmd + ["--write"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "--force" in out.stderr


def test_settings_held_in_a_class_of_literals_or_a_dict_call_are_protected(tmp_path):
    """Styles beyond config globals: a `TrainingArguments`-like class of literal attributes, a
    settings dict written as `dict(...)`. A candidate must not change the work a step does."""
    from trainbridge.workload_init import protected_regions

    (tmp_path / "train.py").write_text('''
import torch

CFG = dict(dim=128, batch=8, seed=0, lr=1e-3)


class TrainingArguments:
    """The run's settings."""
    per_device_train_batch_size = 8
    seq_len: int = 128


class Model(torch.nn.Module):
    hidden = 64

    def forward(self, x):
        return x
''')
    (region,) = protected_regions(tmp_path, ["train.py"])
    assert "TrainingArguments" in region.symbols and "Model" not in region.symbols, region
    assert "CFG" in region.names, region
