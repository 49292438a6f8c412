"""autocast_reapply: a GPU autocast pointed at the target (the port leaves a no-op one), its
spellings and refusals, and standing down on a target without bf16 math units."""

import pytest
import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable

from tests.kits import recipe_testkit as kit
from tests.kits.recipe_testkit import applied as _apply

IDIOMS = kit.read("idioms_gpt.py")
NANO = kit.nanogpt_source()
PROGRAM = kit.read("bf16_math.py")


def test_autocast_recipe_points_gpu_autocast_at_target():
    src = "import torch\nwith torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n    pass\n"
    out = RECIPES["autocast_reapply"].apply({"p.py": src}, "cpu")
    assert "device_type='cpu'" in out.files["p.py"]
    npu = RECIPES["autocast_reapply"].apply({"p.py": src}, "npu")
    assert "device_type='npu'" in npu.files["p.py"]
    assert isinstance(RECIPES["autocast_reapply"].apply({"p.py": "import torch\n"}, "cpu"), NotApplicable)


def test_autocast_reapply_restores_bf16_on_cpu():
    new, out = _apply("autocast_reapply", IDIOMS, "cpu")
    assert 'torch.autocast(device_type="cpu", dtype=torch.bfloat16)' in new and out.sites[0].detail["from"] == "cuda"
    prog = ("import torch\nlin = torch.nn.Linear(8, 8)\nx = torch.randn(2, 8)\n"
            "with torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n    y = lin(x)\n")
    new, _ = _apply("autocast_reapply", prog, "cpu")
    with pytest.warns(UserWarning, match="Disabling autocast"):
        assert kit.load(prog)["y"].dtype == torch.float32  # the port's no-op autocast
    assert kit.load(new)["y"].dtype == torch.bfloat16  # the GPU's precision, on the target


def test_autocast_variants():
    old_api = "import torch\nwith torch.cuda.amp.autocast():\n    pass\n"
    new, out = _apply("autocast_reapply", old_api, "cpu")
    assert 'torch.autocast(device_type="cpu", dtype=torch.bfloat16)' in new
    fp16 = "import torch\nwith torch.amp.autocast('cuda', dtype=torch.float16):\n    pass\n"
    new, out = _apply("autocast_reapply", fp16, "cpu")
    assert "torch.amp.autocast('cpu', dtype=torch.bfloat16)" in new and any("bfloat16" in n for n in out.notes)
    new, _ = _apply("autocast_reapply", fp16, "npu")
    assert "torch.amp.autocast('npu', dtype=torch.float16)" in new
    for src in ("import torch\nwith torch.autocast(device_type='cuda', enabled=False):\n    pass\n",
                "import torch\nx = 1\n"):
        out = RECIPES["autocast_reapply"].apply({"p.py": src}, "cpu")
        assert isinstance(out, NotApplicable) and "out of scope" in out.reason
    assert isinstance(RECIPES["autocast_reapply"].apply({"p.py": IDIOMS}, "cuda"), NotApplicable)


@pytest.mark.skipif(NANO is None, reason="workloads/nanogpt/train_gpt.py not present")
def test_autocast_on_the_cpu_port_of_nanogpt():
    from trainbridge.targets.port_source import port_program

    port = port_program({"train_gpt.py": NANO}, "cpu")
    lost = [c for c in port.changes if c.kind == "precision_lost"]
    new, out = _apply("autocast_reapply", port.files["train_gpt.py"], "cpu", "train_gpt.py")
    assert len(out.sites) == len(lost) >= 1 and 'device_type="cuda"' not in new


def test_autocast_reapply_stands_down_without_bf16_units(slow_bf16):
    out = RECIPES["autocast_reapply"].apply({"train.py": PROGRAM}, "cpu")
    assert isinstance(out, NotApplicable) and "no bf16 math units" in out.reason


def test_autocast_reapply_applies_with_bf16_units(monkeypatch):
    monkeypatch.setenv("TRAINBRIDGE_FAST_BF16", "1")
    out = RECIPES["autocast_reapply"].apply({"train.py": PROGRAM}, "cpu")
    assert not isinstance(out, NotApplicable) and 'device_type="cpu"' in out.files["train.py"]


def test_an_autocast_the_program_skips_on_cpu_is_taken_there_as_the_gpu_took_it():
    # single-file-trainer style: the dtype chosen on the device's abilities, the autocast taken
    # only off the cpu; the port keeps the GPU's dtype and notes the lost autocast
    from trainbridge.targets.port_source import port_program

    gpu = ("from contextlib import nullcontext\nimport torch\ndevice = 'cuda'\n"
           "dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float16'\n"
           "device_type = 'cuda' if 'cuda' in device else 'cpu'\n"
           "ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]\n"
           "ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, "
           "dtype=ptdtype)\n"
           "lin = torch.nn.Linear(8, 8)\nwith ctx:\n    y = lin(torch.randn(2, 8))\n")
    port = port_program({"train.py": gpu}, "cpu")
    assert kit.load(port.files["train.py"])["y"].dtype == torch.float32  # the port: fp32
    assert [c.line for c in port.changes if c.kind == "precision_lost"] == [7]
    new, out = _apply("autocast_reapply", port.files["train.py"], "cpu", "train.py")
    assert len(out.sites) == 1 and out.sites[0].line == 7
    assert 'ctx = torch.autocast(device_type="cpu", dtype=ptdtype)' in new
    assert kit.load(new)["y"].dtype == torch.bfloat16  # the GPU's precision, on the target
