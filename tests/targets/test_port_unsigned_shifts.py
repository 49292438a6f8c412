"""Shifts of unsigned tensors: eager CPU has none, the port routes them through `_tb_bits`.

The program is ours, in the form of the 2026 records' bf16-with-mantissa optimizer step: the
fp32 value rebuilt from a bf16 parameter and its uint16 mantissa, updated, split again.
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trainbridge.targets.port_source import port_program
from trainbridge.targets.shims import shim_source

PROGRAM = '''
import torch

MASK = 1 << 16  # a constant: left alone


@torch.compile(dynamic=False, fullgraph=True)
def update_inplace(p, mantissa, grad, lr):
    assert p.dtype == mantissa.dtype == torch.uint16
    raw = (p.to(torch.uint32) << 16) | mantissa.to(torch.uint32)
    precise = raw.view(torch.float32)
    precise.copy_(precise - grad.float() * lr)
    p.copy_((raw >> 16).to(torch.uint16))
    mantissa.copy_(raw.to(torch.uint16))


def halve(x):
    x >>= 1
    return x
'''


def _load(tmp_path: Path, files: dict[str, str]):
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        spec = importlib.util.spec_from_file_location("ported_mantissa", tmp_path / "mantissa.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_the_shim_shifts_every_unsigned_width_bit_for_bit(dtype):
    ns = {}
    exec(shim_source("bits"), ns)
    bits = {torch.uint16: 16, torch.uint32: 32, torch.uint64: 64}[dtype]
    rng = np.random.default_rng(bits)
    values = rng.integers(0, 2**63 - 1, 500, dtype=np.int64, endpoint=True)
    values = (values.view(np.uint64) * np.uint64(3)) & np.uint64((1 << bits) - 1 if bits < 64 else 2**64 - 1)
    if bits == 64:
        t = torch.from_numpy(values.view(np.int64)).view(torch.uint64)
    else:
        t = torch.from_numpy(values.astype(np.int64)).to(dtype)
    for k in (0, 1, 5, bits // 2, bits - 1):
        for fn, want in ((ns["lshift"], values << np.uint64(k)), (ns["rshift"], values >> np.uint64(k))):
            got = fn(t, k)
            assert got.dtype == dtype
            got = got.view(torch.int64).numpy().view(np.uint64) if bits == 64 else \
                got.to(torch.int64).numpy().astype(np.uint64)
            assert (got == (want & np.uint64((1 << bits) - 1 if bits < 64 else 2**64 - 1))).all(), (fn, k)
    assert ns["lshift"](3, 2) == 12 and ns["rshift"](torch.tensor([-8]), 1).item() == -4, "others: plain operator"


def test_eager_cpu_really_lacks_the_shift():
    """Why the feature exists (if PyTorch gains the kernel, the feature is harmless, not needed)."""
    try:
        torch.tensor([1], dtype=torch.uint32) << 16
    except NotImplementedError:
        return
    pytest.skip("this PyTorch shifts uint32 on the CPU")


def test_port_routes_unsigned_shifts_and_the_update_matches_fp32(tmp_path):
    r = port_program({"mantissa.py": PROGRAM}, "cpu")
    out = r.files["mantissa.py"]
    assert not r.blockers
    assert "_tb_bits.lshift(p.to(torch.uint32), 16)" in out and "_tb_bits.rshift(raw, 16)" in out
    assert "MASK = 1 << 16" in out, "constant shifts stay"
    assert "x = _tb_bits.rshift(x, 1)" in out, "augmented shifts too"
    assert [c.kind for c in r.changes].count("unsigned_shift") == 3
    assert not any(c.semantic_change for c in r.changes if c.kind == "unsigned_shift")
    assert "_tb_bits.py" in r.files
    mod = _load(tmp_path, r.files)
    torch.manual_seed(0)
    w = torch.randn(64, 32)
    raw = w.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    p, mantissa = (raw >> 16).to(torch.uint16), (raw & 0xFFFF).to(torch.uint16)  # bf16 bits + the rest
    grad = torch.randn(64, 32)
    mod.update_inplace(p, mantissa, grad, 0.01)
    rebuilt = ((p.to(torch.int64) << 16) | mantissa.to(torch.int64)).to(torch.int32).view(torch.float32)
    assert torch.equal(rebuilt, w - grad * 0.01), "the fp32 value survives the bf16 + mantissa split exactly"


def test_cuda_target_and_files_without_unsigned_types_are_untouched():
    assert "_tb_bits" not in port_program({"mantissa.py": PROGRAM}, "cuda").files["mantissa.py"]
    plain = "import torch\n\ndef f(x):\n    return x << 2\n"
    assert port_program({"plain.py": plain}, "cpu").files["plain.py"].count("<<") == 1
