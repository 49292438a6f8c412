"""FP8 matmuls ported to the target's 16-bit type: same math without FP8's rounding, flagged.

The program is ours, in the records' form: a torch.library custom op quantizing to float8 and
multiplying with torch._scaled_mm, a fake, an autograd rule with a second custom op.
"""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from trainbridge.targets.port_source import port_program
from trainbridge.targets.shims import shim_source

from tests.kits.paths import FIXTURES

FORMS = FIXTURES / "records_forms"


def _load(tmp_path: Path, files: dict[str, str], name: str):
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        spec = importlib.util.spec_from_file_location(name, tmp_path / "fp8_head.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(tmp_path))


def test_scaled_mm_shim_is_the_scaled_product():
    ns = {}
    exec(shim_source("fp8"), ns)
    a, b = torch.randn(16, 32).bfloat16(), torch.randn(32, 8).bfloat16()
    sa, sb = torch.tensor(0.5), torch.tensor(4.0)
    got = ns["scaled_mm"](a, b, out_dtype=torch.float32, scale_a=sa, scale_b=sb)
    want = (a.float() @ b.float()) * 2.0
    assert got.dtype == torch.float32 and torch.allclose(got, want, rtol=2e-2, atol=2e-2)
    # positional scales, bf16 out
    got = ns["scaled_mm"](a, b, sa, sb, None, None, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.allclose(got.float(), want, rtol=3e-2, atol=5e-2)


def test_port_turns_fp8_into_bf16_and_keeps_fp8_ranges(tmp_path):
    src = (FORMS / "fp8_head.py").read_text()
    r = port_program({"fp8_head.py": src}, "cpu")
    out = "\n".join(ln for ln in r.files["fp8_head.py"].splitlines() if not ln.startswith("#"))
    assert not r.blockers
    assert "torch._scaled_mm" not in out and out.count("_tb_fp8.scaled_mm(") == 3
    assert "torch.finfo(torch.float8_e4m3fn).max" in out          # a range, not a dtype in use: kept
    assert "float8_e5m2" not in out and out.count("torch.float8_e4m3fn") == 1
    assert "@torch.compile" not in out
    fp8 = [c for c in r.changes if c.kind == "fp8_to_16bit"]
    assert fp8 and all(c.semantic_change for c in fp8)
    mod = _load(tmp_path, r.files, "ported_fp8_head")
    assert mod.E4M3_MAX == 448.0
    torch.manual_seed(0)
    x = torch.randn(4, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(96, 64) * 0.02).bfloat16().requires_grad_()
    y = mod.lm_head_fp8(x, w)
    ref_x, ref_w = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ref = ref_x.flatten(0, -2) @ ref_w.T
    assert y.shape == ref.shape and torch.allclose(y.float(), ref, rtol=5e-2, atol=5e-2)
    g = torch.randn_like(ref)
    y.backward(g.bfloat16())
    ref.backward(g)
    cos = torch.nn.functional.cosine_similarity
    assert cos(x.grad.float().flatten(), ref_x.grad.flatten(), dim=0) > 0.999
    assert cos(w.grad.float().flatten(), ref_w.grad.flatten(), dim=0) > 0.999


@pytest.mark.parametrize("target", ["cuda"])
def test_cuda_keeps_fp8(target):
    src = (FORMS / "fp8_head.py").read_text()
    assert port_program({"fp8_head.py": src}, target).files["fp8_head.py"] == src
