"""The port reads a precision chosen on the device's abilities as the GPU read it.

Written in the style of single-file GPT trainers: the dtype string picked from
`torch.cuda.is_available()` and `is_bf16_supported()`, a GradScaler enabled for float16 only,
and an autocast context taken only off the cpu.
"""

import subprocess
import sys
import textwrap

import pytest

from trainbridge.targets.port_source import port_program

PROGRAM = textwrap.dedent('''
    from contextlib import nullcontext
    import torch

    device = "cuda"
    dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
    device_type = "cuda" if "cuda" in device else "cpu"
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
    scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
    print(dtype, scaler.is_enabled(), type(ctx).__name__)
''')


def _port(text):
    return port_program({"train.py": text}, "cpu")


def test_the_dtype_is_the_one_the_gpu_chose_and_the_change_is_named():
    result = _port(PROGRAM)
    src = result.files["train.py"]
    assert 'dtype = "bfloat16"\n' in src and "float16\" if" not in src
    choice = [c for c in result.changes if c.kind == "precision" and c.line == 6]
    assert choice and "as the GPU answered" in choice[0].note and choice[0].after == '"bfloat16"'
    # the dropped test's own note (is_available -> False) is not left behind
    assert not any(c.line == 6 and c.kind == "cuda_api" for c in result.changes)


def test_an_autocast_taken_only_off_the_cpu_is_recorded_as_precision_lost():
    result = _port(PROGRAM)
    lost = [c for c in result.changes if c.kind == "precision_lost"]
    assert len(lost) == 1 and lost[0].line == 9 and lost[0].semantic_change


def test_the_ported_program_runs_bf16_choice_without_a_grad_scaler(tmp_path):
    (tmp_path / "train.py").write_text(_port(PROGRAM).files["train.py"])
    out = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["bfloat16", "False", "nullcontext"]


@pytest.mark.parametrize("line,expected", [
    ("half = torch.float16 if not torch.cuda.is_available() else torch.bfloat16", "half = torch.bfloat16"),
    ("dt = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32", "dt = torch.bfloat16"),
    ("dt = 'fp16' if not torch.cuda.is_bf16_supported() else 'bf16'", "dt = 'bf16'"),
])
def test_other_spellings_of_the_choice(line, expected):
    src = _port(f"import torch\n{line}\n").files["train.py"]
    assert expected in src, src


@pytest.mark.parametrize("line", [
    "n = 4 if torch.cuda.is_available() else 1",                                    # not a dtype
    "dt = torch.bfloat16 if torch.cuda.is_available() and fast else torch.float32",  # depends on more
])
def test_what_is_not_a_device_dtype_choice_is_ported_as_before(line):
    result = _port(f"import torch\nfast = True\n{line}\n")
    assert not any(c.kind == "precision" for c in result.changes)
    assert "False" in result.files["train.py"]
