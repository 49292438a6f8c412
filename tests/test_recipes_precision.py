"""fp32_where_bf16_slow: explicit bf16 math to fp32 on a target without bf16 units, one
function at a time; and autocast_reapply standing down on such a target."""

from pathlib import Path

import pytest
import torch

from trainbridge.agent.rewriters.recipe_base import NotApplicable
from trainbridge.agent.rewriters.recipes import RECIPES
from trainbridge.targets import capabilities

NANOGPT = Path(__file__).resolve().parents[1] / "workloads" / "nanogpt" / "train_gpt.py"
PROGRAM = '''
import torch

def newton_schulz(G):
    X = G.bfloat16()
    X = X / (X.norm() + 1e-7)
    return X @ X.T

def buffers(n):
    flat = torch.zeros(n, device="cpu", dtype=torch.bfloat16)
    other = torch.ones(n).to(torch.bfloat16)
    return flat, other

def forward(x, model):
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        return model(x)
'''


@pytest.fixture
def slow_bf16(monkeypatch):
    monkeypatch.setenv("TRAINBRIDGE_FAST_BF16", "0")


def test_sites_are_functions_with_explicit_bf16_outside_autocast(slow_bf16):
    sites = RECIPES["fp32_where_bf16_slow"].find({"train.py": PROGRAM}, "cpu")
    assert {s.qualname for s in sites} == {"newton_schulz", "buffers"}
    assert {s.qualname: s.detail["casts"] for s in sites} == {"newton_schulz": "1", "buffers": "2"}


def test_one_function_per_candidate(slow_bf16):
    out = RECIPES["fp32_where_bf16_slow"].apply({"train.py": PROGRAM}, "cpu", "newton_schulz")
    assert not isinstance(out, NotApplicable), out
    new = out.files["train.py"]
    assert "X = G.float()" in new
    assert "dtype=torch.bfloat16)" in new and ".to(torch.bfloat16)" in new, "other functions stay as they were"
    assert 'torch.autocast(device_type="cuda", dtype=torch.bfloat16)' in new, "autocast is not this recipe's"
    out2 = RECIPES["fp32_where_bf16_slow"].apply({"train.py": PROGRAM}, "cpu", "buffers")
    assert "dtype=torch.float32)" in out2.files["train.py"] and ".to(torch.float32)" in out2.files["train.py"]


def test_nanogpt_muon_sites_and_numerics(slow_bf16):
    files = {"train_gpt.py": NANOGPT.read_text()}
    sites = {s.qualname for s in RECIPES["fp32_where_bf16_slow"].find(files, "cpu")}
    assert "zeropower_via_newtonschulz5" in sites
    out = RECIPES["fp32_where_bf16_slow"].apply(files, "cpu", "zeropower_via_newtonschulz5")
    ns = {}
    src = out.files["train_gpt.py"]
    start = src.index("def zeropower_via_newtonschulz5")
    end = src.index("\n\n\n", start)
    exec("import torch\n" + src[start:end], ns)
    G = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    fp32 = ns["zeropower_via_newtonschulz5"](G)
    assert fp32.dtype == torch.float32
    # an orthogonalised update: singular values near 1, as with bf16 (the recipe keeps the math)
    s = torch.linalg.svdvals(fp32.float())
    assert 0.5 < s.min() and s.max() < 1.5


def test_not_applicable_where_bf16_is_native(monkeypatch):
    monkeypatch.setenv("TRAINBRIDGE_FAST_BF16", "1")
    rec = RECIPES["fp32_where_bf16_slow"]
    assert rec.find({"train.py": PROGRAM}, "cpu") == []
    out = rec.apply({"train.py": PROGRAM}, "cpu")
    assert isinstance(out, NotApplicable) and "natively" in out.reason
    assert isinstance(rec.apply({"train.py": PROGRAM}, "npu"), NotApplicable)


def test_autocast_reapply_stands_down_without_bf16_units(slow_bf16):
    out = RECIPES["autocast_reapply"].apply({"train.py": PROGRAM}, "cpu")
    assert isinstance(out, NotApplicable) and "no bf16 math units" in out.reason


def test_autocast_reapply_applies_with_bf16_units(monkeypatch):
    monkeypatch.setenv("TRAINBRIDGE_FAST_BF16", "1")
    out = RECIPES["autocast_reapply"].apply({"train.py": PROGRAM}, "cpu")
    assert not isinstance(out, NotApplicable) and 'device_type="cpu"' in out.files["train.py"]


def test_capability_reads_cpu_flags(monkeypatch):
    monkeypatch.delenv("TRAINBRIDGE_FAST_BF16", raising=False)
    monkeypatch.setattr(capabilities, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert capabilities.fast_bf16("cpu") is False
    monkeypatch.setattr(capabilities, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert capabilities.fast_bf16("cpu") is True
    assert capabilities.fast_bf16("cuda") is True
