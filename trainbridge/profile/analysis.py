"""Baseline profile of a harness run: where one step's time goes, and a bottleneck verdict.

Stateless: a `RunResult` (measured steps + profiler window + op count) in, a
`ProfileReport` out. The verdict follows the bottleneck classes of the Ascend tuning guide
(docs/method.md): host-bound (device idle between small operators; on a CPU, the
time outside operators: Python and dispatch), compute-bound (GEMM/convolution dominate),
memory-bound (elementwise and reduction operators dominate), communication-bound.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from ..aten_ops import MATRIX_ENGINE, profiler_names
from ..harness.models import RunResult
from .floor import FloorSummary

Verdict = Literal["host-bound", "compute-bound", "memory-bound", "communication-bound", "unknown"]

# Operators whose time is matrix-engine work (cube on Ascend, tensor cores on GPU).
GEMM_OPS = profiler_names(MATRIX_ENGINE)
COMM_MARKERS = ("nccl", "gloo", "hccl", "c10d::", "allreduce", "all_reduce", "reduce_scatter", "all_gather")
# Composite ops whose time is already counted in the kernels they call (self time is tiny).
HOST_THRESHOLD = 0.10  # free/outside-operator share that makes a step host-bound (advisor rule)
SHARE_THRESHOLD = 0.5


class StepTimes(BaseModel):
    n: int
    median_ms: float
    mean_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    max_ms: float
    rel_spread: float = Field(..., description="(p90 - p10) / median")
    raw_ms: list[float]
    warmup_ms: list[float]


class OpRow(BaseModel):
    name: str
    calls_per_step: float
    self_ms_per_step: float
    share: float = Field(..., description="of all operator self time in the window")
    kind: Literal["gemm", "elementwise/reduction", "communication", "other"]


class ProfileReport(BaseModel):
    workload: str
    target: str
    step: StepTimes
    profile_steps: int
    trace_path: str | None
    ops_per_step: int | None = Field(None, description="ATen ops reaching the dispatcher in one step (fragmentation)")
    distinct_ops: int | None = None
    flops_per_step: int | None = None
    achieved_gflops: float | None = None
    op_self_ms_per_step: float = Field(..., description="sum of operator self time per profiled step")
    outside_ops_ms_per_step: float = Field(..., description="step time not inside any operator: Python, dispatch, idle")
    outside_ops_share: float
    gemm_share: float = Field(..., description="GEMM/conv share of operator self time")
    elementwise_share: float
    communication_share: float
    device_busy_share: float | None = Field(None, description="device self time / step time, where the target has a device")
    mean_op_us: float | None = None
    top_ops: list[OpRow]
    all_ops: list[OpRow] = Field(default_factory=list, description="every operator of the window, by self time")
    verdict: Verdict
    evidence: list[str] = Field(..., description="the numbers the verdict rests on, in words")
    peak_memory_mb: float | None = None
    environment: dict = Field(default_factory=dict)
    step_functions: dict[str, int] | None = Field(
        None, description="the program's functions called in one training step ('file.py:qualname' -> calls); "
                          "None when the run recorded none")
    profile_dir: str | None = Field(None, description="the profiler's own output folder, kept with the run")
    ascend: dict | None = Field(None, description="on npu: the AscendProfileReport of the torch_npu profiler's "
                                "folder (verdict, breakdown, findings), as `trainbridge profile DIR` prints it")
    floor: FloorSummary | None = Field(None, description="the step's floor on this machine (profile/floor.py)")

    def op_ms_by_kind(self) -> dict[str, float]:
        """Operator self time per step by kind, over every operator of the window."""
        out: dict[str, float] = {}
        for row in self.all_ops or self.top_ops:
            out[row.kind] = out.get(row.kind, 0.0) + row.self_ms_per_step
        return out


def summarize_steps(raw: list[float], warmup: list[float]) -> StepTimes:
    s = sorted(raw)
    q = statistics.quantiles(s, n=10, method="inclusive") if len(s) > 1 else [s[0]] * 9
    med = statistics.median(s)
    return StepTimes(
        n=len(s), median_ms=med, mean_ms=statistics.fmean(s), p10_ms=q[0], p90_ms=q[-1],
        min_ms=s[0], max_ms=s[-1], rel_spread=(q[-1] - q[0]) / med if med else 0.0,
        raw_ms=raw, warmup_ms=warmup,
    )


def classify_op(name: str) -> str:
    low = name.lower()
    if any(m in low for m in COMM_MARKERS):
        return "communication"
    if name in GEMM_OPS:
        return "gemm"
    if name.startswith("aten::"):
        return "elementwise/reduction"
    return "other"


def _is_operator(name: str) -> bool:
    """Rows that are operators (aten / vendor / c10d), not profiler or Python annotations."""
    return "::" in name and not name.startswith(("ProfilerStep", "Optimizer.", "autograd::engine"))


def analyse(result: RunResult, workload: str, *, top: int = 15) -> ProfileReport:
    if not result.measured_ms:
        raise ValueError(f"run {result.status}: no measured steps to profile ({result.error})")
    step = summarize_steps(result.measured_ms, result.warmup_ms)
    prof_ms = [s.step_ms for s in result.steps if s.phase == "profile"]
    evidence: list[str] = []
    on_npu = result.request.target == "npu" and not result.request.npu_reference  # not a dry run
    ascend = _ascend_report(result.profile_dir, evidence) if on_npu else None
    return _report(
        workload=workload, target=result.request.target, step=step, n_prof=max(1, result.request.profile_steps),
        prof_step_ms=statistics.fmean(prof_ms) if prof_ms else step.median_ms, profile_steps=len(prof_ms),
        rows=result.profile_ops or [], ops=result.ops_per_step.total if result.ops_per_step else None,
        distinct_ops=len(result.ops_per_step.by_op) if result.ops_per_step else None,
        flops_per_step=result.flops_per_step, extra_evidence=evidence, top=top,
        trace_path=result.profile_trace_path, step_functions=result.step_functions,
        peak_memory_mb=result.peak_memory_mb, environment=result.environment.model_dump() if result.environment else {},
        profile_dir=result.profile_dir, ascend=ascend)


def analyse_trace(window, workload: str, *, top: int = 15) -> ProfileReport:
    """The same report for a PyTorch profiler trace the user already has (`torch_trace`)."""
    steps = window.step_ms or [window.window_ms]
    step = summarize_steps(steps, [])
    evidence = [] if window.step_ms else [
        "no ProfilerStep#N annotations (a profiler without a schedule): the whole trace is taken as one step"]
    return _report(workload=workload, target="trace", step=step, n_prof=len(steps), prof_step_ms=step.mean_ms,
                   profile_steps=len(window.step_ms), rows=window.rows, ops=None, distinct_ops=len(window.rows),
                   flops_per_step=None, extra_evidence=evidence, top=top, trace_path=window.path,
                   device_busy_us=window.device_busy_us or None)


def _report(*, workload: str, target: str, step: StepTimes, n_prof: int, prof_step_ms: float, profile_steps: int,
            rows: list[dict], ops: int | None, distinct_ops: int | None, flops_per_step: int | None,
            extra_evidence: list[str], top: int, trace_path: str | None, device_busy_us: float | None = None,
            **fields) -> ProfileReport:
    """Where the profiled step's time goes, and the verdict, from operator rows and step times."""
    rows = [r for r in rows if _is_operator(r["name"])]
    total_self_us = sum(r["self_cpu_us"] for r in rows) or 1e-9
    kinds = {"gemm": 0.0, "elementwise/reduction": 0.0, "communication": 0.0, "other": 0.0}
    op_rows = []
    for r in rows:
        kind = classify_op(r["name"])
        kinds[kind] += r["self_cpu_us"]
        op_rows.append(OpRow(
            name=r["name"], calls_per_step=r["calls"] / n_prof,
            self_ms_per_step=r["self_cpu_us"] / 1e3 / n_prof, share=r["self_cpu_us"] / total_self_us,
            kind=kind,  # type: ignore[arg-type]
        ))
    op_rows.sort(key=lambda o: o.self_ms_per_step, reverse=True)
    op_ms = total_self_us / 1e3 / n_prof
    outside_ms = max(0.0, prof_step_ms - op_ms)
    outside_share = outside_ms / prof_step_ms if prof_step_ms else 0.0
    gemm = kinds["gemm"] / total_self_us
    elem = kinds["elementwise/reduction"] / total_self_us
    comm = kinds["communication"] / total_self_us
    device_us = device_busy_us if device_busy_us is not None else sum(r.get("self_device_us", 0.0) for r in rows)
    device_busy = (device_us / 1e3 / n_prof) / prof_step_ms if device_us > 0 and prof_step_ms else None
    mean_op_us = (op_ms * 1e3 / ops) if ops else None
    gflops = (flops_per_step / (step.median_ms / 1e3) / 1e9) if flops_per_step else None

    evidence = [
        f"median step {step.median_ms:.1f} ms over {step.n} steps (p10-p90 spread {step.rel_spread:.1%})",
        f"operators account for {op_ms:.1f} ms of a {prof_step_ms:.1f} ms profiled step; "
        f"{outside_share:.1%} of it is outside any operator",
        f"GEMM/conv {gemm:.1%}, elementwise/reduction {elem:.1%}, communication {comm:.1%} of operator time",
    ]
    if ops:
        evidence.append(f"{ops} ATen ops per step, {mean_op_us:.1f} us of operator time each on average")
    if device_busy is not None:
        evidence.append(f"device busy {device_busy:.1%} of the step, free {1 - device_busy:.1%}")
    free = (1 - device_busy) if device_busy is not None else outside_share
    if comm > 0.2:
        verdict: Verdict = "communication-bound"
    elif free > HOST_THRESHOLD and (mean_op_us is None or mean_op_us < 50 or free > 0.3):
        verdict = "host-bound"
        evidence.append(f"free/outside share {free:.1%} > {HOST_THRESHOLD:.0%} (advisor rule)")
    elif gemm >= SHARE_THRESHOLD:
        verdict = "compute-bound"
        evidence.append(f"GEMM share {gemm:.1%} >= {SHARE_THRESHOLD:.0%}: fusion alone gains little; precision and work removal can")
    elif elem >= SHARE_THRESHOLD:
        verdict = "memory-bound"
        evidence.append(f"elementwise/reduction share {elem:.1%} >= {SHARE_THRESHOLD:.0%}: fusion removes intermediate traffic")
    else:
        verdict = "unknown"
    return ProfileReport(
        workload=workload, target=target, step=step, profile_steps=profile_steps,
        trace_path=trace_path, ops_per_step=ops, distinct_ops=distinct_ops,
        flops_per_step=flops_per_step, achieved_gflops=gflops,
        op_self_ms_per_step=op_ms, outside_ops_ms_per_step=outside_ms, outside_ops_share=outside_share,
        gemm_share=gemm, elementwise_share=elem, communication_share=comm,
        device_busy_share=device_busy, mean_op_us=mean_op_us, top_ops=op_rows[:top], all_ops=op_rows,
        verdict=verdict, evidence=evidence + extra_evidence, **fields,
    )


def _advisor(profile_dir: str, evidence: list[str]):
    """msprof-analyze's advisor on the same folder where it is installed, its output kept beside
    the folder (`msprof_advisor/`); its findings join ours in the plan, marked as its."""
    from .ascend.advisor import run_advisor

    rep = run_advisor(profile_dir, Path(profile_dir).parent / "msprof_advisor")
    if rep is None:
        evidence.append("msprof-analyze is not installed: our Ascend analysis alone (the [npu] extra installs it)")
    else:
        evidence.append(f"msprof-analyze advisor: {len(rep.findings)} finding(s) in {rep.out_dir}"
                        + (f"; {rep.note}" if rep.note else ""))
    return rep


def _ascend_report(profile_dir: str | None, evidence: list[str]) -> dict | None:
    """The Ascend analysis of an npu run's torch_npu profiler folder; why not, in `evidence`."""
    if not profile_dir:
        evidence.append("no torch_npu profiler folder was written: the Ascend analysis did not run")
        return None
    from .ascend import AscendProfileError, analyse_ranks

    try:
        ranks = analyse_ranks(profile_dir)
    except AscendProfileError as e:
        evidence.append(f"the torch_npu profiler folder could not be analysed: {e}")
        return None
    for _, report in ranks:
        if not isinstance(report, AscendProfileError):
            evidence.append(f"Ascend profile: {report.verdict} ({report.path})")
            report.advisor = _advisor(profile_dir, evidence)
            return report.model_dump(mode="json")
    evidence.append(f"the torch_npu profiler folder could not be analysed: {ranks[0][1] if ranks else 'empty'}")
    return None
