"""The step's floor (profile/floor.py): recorded calls, replayed at their own shapes.

The op-count step records every matrix-engine call by signature; the floor's child rebuilds
each call from shapes, strides and dtypes and times it alone. A program whose step is one
large matmul has a floor close to its step; an argument the replay cannot rebuild is named,
not fatal.
"""

from __future__ import annotations

import pytest
import torch

from trainbridge.harness.models import KernelCall
from trainbridge.harness.runner import run_workload
from trainbridge.profile.analysis import analyse
from trainbridge.profile.floor import FloorRequest, StepFloor, _tensor, floor_request, measure_floor, summarise
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES


def _workload(tmp_path, body: str, name: str = "mm"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "train.py").write_text(body)
    (folder / "trainbridge.toml").write_text(
        f'name = "{name}"\nentry = "train.py"\nargs = []\neditable = ["train.py"]\nnative_device = "cpu"\n'
        "[steps]\nwarmup = 1\nmeasured = 4\n[work]\nunit = \"samples\"\nper_step = 64\n"
        "[limits]\ntimeout_s = 120\nmemory_limit_mb = 3000\n")
    return load_workload(folder)


ONE_BIG_MATMUL = '''
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Linear(1024, 1024, bias=False)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, 1024)
for _ in range(100):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
'''


def test_the_op_count_step_records_each_matrix_call_by_signature():
    tiny = load_workload(FIXTURES / "harness" / "tiny")
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        r = run_workload(tiny, "cpu", out_dir=Path(d), warmup_steps=1, measured_steps=1, count_ops=True)
    assert r.status == "ok", r.error
    calls = {c.op: c for c in r.kernel_calls}
    # the tiny program's Linear: addmm forward, mm for the weight and input gradients
    assert "aten.addmm.default" in calls and calls["aten.addmm.default"].calls == 1
    addmm = calls["aten.addmm.default"].args
    assert addmm[1]["shape"] == [32, 16] and addmm[2]["shape"] == [16, 32] and addmm[2]["stride"] == [1, 16]
    total = sum(c.calls for c in r.kernel_calls)
    counted = sum(n for op, n in r.ops_per_step.by_op.items() if op in ("aten.addmm", "aten.mm", "aten.bmm"))
    assert total == counted


def test_a_step_that_is_one_big_matmul_sits_near_its_floor(tmp_path):
    wl = _workload(tmp_path, ONE_BIG_MATMUL)
    r = run_workload(wl, "cpu", out_dir=tmp_path / "out", warmup_steps=2, measured_steps=6, profile_steps=2,
                     count_ops=True, count_flops=True)
    assert r.status == "ok", r.error
    req = floor_request(r, "cpu")
    assert {c.op for c in req.kernel_calls} == {"aten.mm.default"}  # forward, and the weight gradient
    floor = measure_floor(req, tmp_path / "floor")
    assert not floor.skipped and floor.matrix_ms > 0 and floor.elementwise_ms > 0
    assert sum(k.calls_per_step for k in floor.kernels) == 2  # y = x W^T, dW = dy^T x (x needs no gradient)
    step = sorted(r.measured_ms)[len(r.measured_ms) // 2]
    # two 64x1024x1024 products, nothing else of size: the floor is most of the step
    assert 0.3 * step < floor.floor_ms < 1.5 * step, (floor.floor_ms, step)
    prof = analyse(r, "mm")
    s = summarise(floor, step_ms=step, op_ms_by_kind=prof.op_ms_by_kind(), outside_ms=prof.outside_ops_ms_per_step)
    assert s.step_over_floor == pytest.approx(step / floor.floor_ms)
    assert set(s.above_floor_ms) == {"matrix", "elementwise", "other operators", "outside operators"}
    assert f"{s.step_over_floor:.2f}x its floor" in s.line()


def test_a_transposed_or_expanded_argument_is_rebuilt_with_its_strides():
    t = _tensor({"shape": [16, 32], "stride": [1, 16], "dtype": "float32"}, torch)
    assert t.shape == (16, 32) and t.stride() == (1, 16) and not t.is_contiguous()
    e = _tensor({"shape": [4, 8, 8], "stride": [0, 8, 1], "dtype": "bfloat16"}, torch)
    assert e.stride() == (0, 8, 1) and e.dtype == torch.bfloat16
    assert _tensor({"shape": [3], "dtype": "int64"}, torch).dtype == torch.int64


def test_a_call_the_replay_cannot_rebuild_is_named_and_the_floor_still_measured(tmp_path):
    good = KernelCall(op="aten.mm.default", args=[{"shape": [64, 64], "dtype": "float32"},
                                                  {"shape": [64, 64], "dtype": "float32"}], calls=3)
    bad = KernelCall(op="aten.mm.default", args=[{"shape": [64, 32], "dtype": "float32"},
                                                 {"shape": [64, 64], "dtype": "float32"}], calls=1)
    unknown = KernelCall(op="aten.no_such_kernel.default", args=[], calls=1)
    req = FloorRequest(target="cpu", kernel_calls=[good, bad, unknown], elementwise_elements=10_000,
                       elementwise_calls=10)
    floor = measure_floor(req, tmp_path)
    assert len(floor.kernels) == 1 and floor.kernels[0].calls_per_step == 3
    assert floor.kernels[0].ms_per_step == pytest.approx(3 * floor.kernels[0].ms_per_call)
    assert len(floor.skipped) == 2 and any("no_such_kernel" in s for s in floor.skipped)
    assert any("float32[64,32]" in s and "RuntimeError" in s for s in floor.skipped), floor.skipped
    assert StepFloor.model_validate_json((tmp_path / "floor.json").read_text()) == floor
