"""The step's floor: its own matrix-engine calls and elementwise work at the target's measured rates.

A speedup says how far a program came, not how far it could go. The floor is the time one
step's unavoidable work takes on this machine, measured, not looked up:

- **matrix**: every matrix product, convolution and fused-attention call the op-count step
  recorded (`RunResult.kernel_calls`: op, argument shapes, strides and dtypes, calls per
  step), replayed alone on fresh tensors of those shapes and timed; the step's matrix floor
  is the sum of calls x time per call. These are the kernels a program cannot avoid at its
  precision (a lower precision is a different program, and a different floor).
- **elementwise**: the step's elementwise elements (`RunResult.elementwise_per_step`, fused
  ops counted as their decomposition) at the rate of one add of the step's mean elementwise
  size (in cache when the step's tensors are): the cost of one pass per arithmetic op. A fused
  kernel does several ops per pass, so a program can go below this part; it is the unfused
  cost, named as such.

Step / floor then says how much of the step is overhead (dispatch, Python, unfused traffic),
and the time above the floor by category says where. The measurement runs in its own child
process (`python -m trainbridge.profile.floor REQUEST RESULT`) with the harness's thread
defaults, so the loop's parent never computes and a crash costs only the floor.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel, Field

from ..harness.models import KernelCall, RunResult

ELEMENTWISE_PROBE_MIN = 4096  # elements: below this an add measures dispatch, not arithmetic
_MIN_TIMED_S = 0.02
_MAX_REPS = 20
_BUDGET_S = 60.0


class KernelTime(BaseModel):
    op: str
    shapes: str = Field(description="the tensor arguments' shapes and dtypes, as written in the ledger")
    calls_per_step: int
    ms_per_call: float
    ms_per_step: float
    samples_ms: list[float] = Field(default_factory=list, description="per-call times of each timed batch "
                                                                       "(ms_per_call is the fastest)")


class FloorRequest(BaseModel):
    target: str
    kernel_calls: list[KernelCall]
    elementwise_elements: int
    elementwise_calls: int
    elementwise_dtype: str = "float32"


class StepFloor(BaseModel):
    """One step's floor on this machine; `floor_ms` = matrix + elementwise."""

    matrix_ms: float = Field(description="matrix products, convolutions and fused attention at their own shapes")
    elementwise_ms: float = Field(description="elementwise elements at one pass per op (fusion can go below)")
    floor_ms: float
    elementwise_ns_per_element: float
    elementwise_probe_elements: int
    kernels: list[KernelTime]
    skipped: list[str] = Field(default_factory=list, description="calls that could not be replayed, with why")
    bench_s: float = 0.0
    cpu: str = ""

    def above_floor_line(self, step_ms: float) -> str:
        return (f"step {step_ms:.1f} ms is {step_ms / self.floor_ms:.2f}x its floor of {self.floor_ms:.1f} ms "
                f"(matrix {self.matrix_ms:.1f} ms, elementwise at one pass per op {self.elementwise_ms:.1f} ms)")


def _tensor(spec: dict, torch):
    dtype = getattr(torch, spec["dtype"])
    shape, stride = spec["shape"], spec.get("stride")
    if stride is None:
        stride = [0] * len(shape)
        acc = 1
        for i in range(len(shape) - 1, -1, -1):
            stride[i] = acc
            acc *= max(shape[i], 1)
    storage = 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0) if all(shape) else 0
    if dtype.is_floating_point:
        base = torch.randn(max(storage, 1)).to(dtype)
    else:
        base = torch.zeros(max(storage, 1), dtype=dtype)
    return torch.as_strided(base, shape, stride)


def _materialise(value, torch):
    if isinstance(value, dict) and "shape" in value and "dtype" in value:
        return _tensor(value, torch)
    if isinstance(value, list):
        return [_materialise(v, torch) for v in value]
    return value


def _shapes(args: list) -> str:
    def one(v):
        if isinstance(v, dict) and "shape" in v:
            return f"{v['dtype']}[{','.join(map(str, v['shape']))}]"
        if isinstance(v, list) and any(isinstance(x, dict) for x in v):
            return "(" + ", ".join(one(x) for x in v if isinstance(x, dict)) + ")"
        return None
    return " ".join(s for s in (one(a) for a in args) if s)


def _time_per_call(fn, sync) -> tuple[float, list[float]]:
    """Fastest per-call time (ms) over batches of calls after two warm-up calls: a floor is what
    the kernel can do, and on a shared machine every slower batch is somebody else's load."""
    fn(), fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    once = max(time.perf_counter() - t0, 1e-6)
    per_batch = max(1, min(50, math.ceil(0.005 / once)))
    samples = []
    start = time.perf_counter()
    while len(samples) < 3 or (time.perf_counter() - start < _MIN_TIMED_S and len(samples) < _MAX_REPS):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) * 1e3 / per_batch)
    return min(samples), samples


def bench(req: FloorRequest) -> StepFloor:
    """Runs in the floor's child: replay every call, time one add."""
    import torch

    from ..targets.capabilities import cpu_signature
    from ..targets import get_target

    target = get_target(req.target)
    target.check_available()
    device = target.device
    sync = target.synchronize
    kernels, skipped = [], []
    t_start = time.perf_counter()
    with torch.no_grad():
        for call in req.kernel_calls:
            if time.perf_counter() - t_start > _BUDGET_S:
                skipped.append(f"{call.op} {_shapes(call.args)}: the floor's {_BUDGET_S:.0f} s budget ran out")
                continue
            try:
                ns, name, overload = call.op.split(".")
                op = getattr(getattr(getattr(torch.ops, ns), name), overload)
                args = _to(_materialise(call.args, torch), device, torch)
                kwargs = _to({k: _materialise(v, torch) for k, v in call.kwargs.items()}, device, torch)
                ms, samples = _time_per_call(lambda: op(*args, **kwargs), sync)
            except Exception as e:  # noqa: BLE001 - an argument the replay cannot rebuild: said, not fatal
                skipped.append(f"{call.op} {_shapes(call.args)}: {type(e).__name__}: {str(e)[:120]}")
                continue
            kernels.append(KernelTime(op=call.op, shapes=_shapes(call.args), calls_per_step=call.calls,
                                      ms_per_call=ms, ms_per_step=ms * call.calls,
                                      samples_ms=[round(x, 6) for x in samples]))
        n = max(ELEMENTWISE_PROBE_MIN, req.elementwise_elements // max(req.elementwise_calls, 1))
        dtype = getattr(torch, req.elementwise_dtype)
        a, b = (torch.randn(n, device=device).to(dtype) for _ in range(2))
        out = torch.empty_like(a)
        add_ms, _ = _time_per_call(lambda: torch.add(a, b, out=out), sync)
    ns_per_element = add_ms * 1e6 / n
    matrix = sum(k.ms_per_step for k in kernels)
    elementwise = req.elementwise_elements * ns_per_element / 1e6
    return StepFloor(matrix_ms=matrix, elementwise_ms=elementwise, floor_ms=matrix + elementwise,
                     elementwise_ns_per_element=ns_per_element, elementwise_probe_elements=n,
                     kernels=sorted(kernels, key=lambda k: -k.ms_per_step), skipped=skipped,
                     bench_s=time.perf_counter() - t_start, cpu=cpu_signature())


def _to(value, device, torch):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [_to(v, device, torch) for v in value]
    if isinstance(value, dict):
        return {k: _to(v, device, torch) for k, v in value.items()}
    return value


def floor_request(run: RunResult, target: str) -> FloorRequest | None:
    """What a run recorded for its floor, or None when it recorded no op-count or elementwise step."""
    if run.kernel_calls is None or run.elementwise_per_step is None:
        return None
    gemm = (run.ops_per_step.gemm_by_dtype if run.ops_per_step else {}) or {}
    dtype = max(gemm, key=gemm.get) if gemm else "float32"
    return FloorRequest(target=target, kernel_calls=run.kernel_calls,
                        elementwise_elements=run.elementwise_per_step.total,
                        elementwise_calls=run.elementwise_per_step.calls,
                        elementwise_dtype=dtype if dtype in ("float32", "bfloat16", "float16") else "float32")


def measure_floor(req: FloorRequest, out_dir: Path, *, env: dict | None = None, timeout_s: float = 180.0) -> StepFloor:
    """Run the floor's child on `req`; its request and result stay in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    request, result = out_dir / "floor_request.json", out_dir / "floor.json"
    request.write_text(req.model_dump_json())
    env = dict(os.environ if env is None else env)
    # the child must import this very trainbridge, whatever the working folder (as harness children do)
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_root, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "trainbridge.profile.floor", str(request), str(result)],
                          capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0 or not result.exists():
        raise RuntimeError(f"floor measurement failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}")
    return StepFloor.model_validate_json(result.read_text())


def main(argv: list[str]) -> int:
    req = FloorRequest.model_validate_json(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(bench(req).model_dump(), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


class FloorSummary(BaseModel):
    """The floor beside the measured step, by category (what the ledger and reports show)."""

    step_ms: float = Field(description="the profiled program's median step")
    floor_ms: float
    matrix_ms: float
    elementwise_ms: float
    step_over_floor: float
    above_floor_ms: dict[str, float] = Field(
        description="measured time per step minus its floor, by category: matrix (operator self time of matrix "
                    "kernels minus the matrix floor), elementwise (minus one pass per op), other operators, and "
                    "outside operators (Python, dispatch, idle); the largest is where the step's overhead is")
    cpu: str = ""
    path: str | None = None

    def line(self) -> str:
        above = sorted(self.above_floor_ms.items(), key=lambda kv: -kv[1])
        parts = ", ".join(f"{k} {v:+.1f}" for k, v in above)
        return (f"step {self.step_ms:.1f} ms = {self.step_over_floor:.2f}x its floor of {self.floor_ms:.1f} ms "
                f"(matrix {self.matrix_ms:.1f}, elementwise at one pass per op {self.elementwise_ms:.1f}); "
                f"ms above the floor: {parts}")


def summarise(floor: StepFloor, *, step_ms: float, op_ms_by_kind: dict[str, float], outside_ms: float,
              path: str | None = None) -> FloorSummary:
    """`op_ms_by_kind`: the profile's operator self time per step by kind ('gemm',
    'elementwise/reduction', anything else)."""
    matrix = op_ms_by_kind.get("gemm", 0.0)
    elementwise = op_ms_by_kind.get("elementwise/reduction", 0.0)
    other = sum(v for k, v in op_ms_by_kind.items() if k not in ("gemm", "elementwise/reduction"))
    return FloorSummary(
        step_ms=step_ms, floor_ms=floor.floor_ms, matrix_ms=floor.matrix_ms, elementwise_ms=floor.elementwise_ms,
        step_over_floor=step_ms / floor.floor_ms if floor.floor_ms > 0 else float("inf"),
        above_floor_ms={"matrix": matrix - floor.matrix_ms, "elementwise": elementwise - floor.elementwise_ms,
                        "other operators": other, "outside operators": outside_ms},
        cpu=floor.cpu, path=path)
