"""The fake torch_npu: install/uninstall hygiene, the torch.npu stand-ins, and a whole dry run."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from trainbridge.npu_reference import fake_torch_npu as fake


@pytest.fixture
def tnpu():
    mod = fake.install()
    yield mod
    fake.uninstall()


def test_install_then_import_torch_npu_works(tnpu):
    import torch_npu

    assert torch_npu is tnpu and torch_npu.__trainbridge_reference__ is True and fake.is_reference()
    x, w = torch.randn(2, 8), torch.ones(8)
    y, rstd = torch_npu.npu_rms_norm(x, w)
    torch.testing.assert_close(y, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    from torch_npu.contrib import transfer_to_npu  # noqa: F401  (a no-op on the reference)
    from torch_npu.optim import NpuFusedAdamW

    assert NpuFusedAdamW.__name__ == "NpuFusedAdamW"
    assert torch_npu.npu is torch.npu and torch.npu.__trainbridge_reference__


def test_torch_npu_stand_ins(tnpu):
    npu = torch.npu
    assert npu.is_available() and npu.device_count() == 1 and npu.current_device() == 0
    npu.synchronize()
    npu.reset_peak_memory_stats()
    assert npu.max_memory_allocated() == 0 and npu.get_device_name() == "reference (CPU)"
    assert npu.matmul.allow_hf32 is False and npu.config.allow_internal_format is False
    npu.set_compile_mode(jit_compile=False)
    assert npu.get_compile_mode() == {"jit_compile": False}
    e0, e1 = npu.Event(enable_timing=True), npu.Event(enable_timing=True)
    e0.record()
    e1.record()
    assert e0.elapsed_time(e1) == 0.0  # never a timing
    import torch_npu.npu  # noqa: F401  (submodule import path works)


def test_uninstall_restores_sys_modules():
    before = {k: sys.modules.get(k) for k in ("torch_npu", "torch.npu", "torch_npu.optim")}
    had_attr = hasattr(torch, "npu")
    with fake.installed():
        assert "torch_npu" in sys.modules and hasattr(torch, "npu")
    assert {k: sys.modules.get(k) for k in before} == before and hasattr(torch, "npu") == had_attr
    fake.uninstall()  # idempotent


def test_refuses_to_shadow_a_real_torch_npu(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    with pytest.raises(RuntimeError, match="real torch_npu"):
        fake.install()


SOURCE = '''
import os
import torch
import torch_npu
import torch.nn as nn
import torch.nn.functional as F

rank = int(os.environ.get("RANK", "0"))
device = torch.device("npu", rank)
dev2 = f"npu:{rank}"
backend = "hccl"
torch_npu.npu.set_compile_mode(jit_compile=False)
msg = "running on npu hardware"


class Block(nn.Module):
    def __init__(self, d=32, h=4):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(2 * d, d)
        self.w = nn.Parameter(torch.ones(d))

    def forward(self, x):
        b, t, d = x.shape
        x = torch_npu.npu_rms_norm(x, self.w, epsilon=1e-5)[0]
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        y = torch_npu.npu_fusion_attention(q, k, v, self.h, "BNSD", atten_mask=mask,
                                           scale=1.0 / (d // self.h) ** 0.5)[0]
        x = x + y.transpose(1, 2).reshape(b, t, d)
        return x + self.down(torch_npu.npu_swiglu(self.up(x), dim=-1))


torch.manual_seed(0)
model = Block().to(device)
opt = torch_npu.optim.NpuFusedAdamW(model.parameters(), lr=1e-2)
data = torch.randn(4, 8, 32).npu()
losses = []
for step in range(3):
    loss = model(data.to(dev2)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    torch.npu.synchronize()
    losses.append(loss.item())
peak = torch.npu.max_memory_allocated()
'''


def test_dry_run_rewrite_maps_devices_and_keeps_torch_npu_calls():
    out, changes = fake.dry_run_rewrite(SOURCE)
    assert 'torch.device("cpu")' in out and 'dev2 = "cpu"' in out and 'backend = "gloo"' in out
    assert "torch.randn(4, 8, 32).cpu()" in out
    assert "torch_npu.npu_fusion_attention(" in out and "torch.npu.synchronize()" in out
    assert "torch_npu.npu.set_compile_mode" in out and '"running on npu hardware"' in out
    assert len(changes) == 5
    assert fake.npu_to_cpu_for_dry_run('x.to("npu:0")') == 'x.to("cpu")'


def test_dry_run_executes_the_npu_program_on_the_references():
    ns: dict = {}
    with fake.installed():
        exec(compile(fake.npu_to_cpu_for_dry_run(SOURCE), "<dry-run>", "exec"), ns)
        assert fake.is_reference()
    assert len(ns["losses"]) == 3 and ns["losses"][-1] < ns["losses"][0]
    assert ns["peak"] == 0
