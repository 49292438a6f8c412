"""fp32_where_bf16_slow: explicit bf16 math to fp32 on a target without bf16 units, one
function at a time (the `slow_bf16` fixture is in tests/recipes/conftest.py)."""

import torch

from trainbridge.agent.rewriters.recipe_base import NotApplicable
from trainbridge.agent.rewriters.recipes import RECIPES

from tests.kits import recipe_testkit as kit

NANOGPT = kit.NANOGPT
PROGRAM = kit.read("bf16_math.py")


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
