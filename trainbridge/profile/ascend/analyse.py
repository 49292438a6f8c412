"""The verdict and the front door: `analyse_ascend` joins every analyzer into one report."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ...targets import npu_catalog
from ..analysis import Verdict
from .affinity import affinity_matches
from .breakdown import kernel_breakdown, kernel_time, step_breakdown
from .findings import (
    aicpu_ops,
    bound_ops,
    check_environment,
    matmul_alignment,
    schedule_check,
)
from .load import find_output_dirs, load_ascend_profile
from .models import (
    AscendProfile,
    AscendProfileError,
    AscendProfileReport,
    Finding,
    KernelTime,
    StepBreakdown,
)

HOST_BOUND_FREE_SHARE = 0.10    # advisor: free > 10% of the step
COMM_BOUND_SHARE = 0.20         # uncovered communication share that dominates a step
SHARE_THRESHOLD = 0.5           # cube vs vector share of kernel time (as in analysis.py)


def _verdict(bd: StepBreakdown | None, kt: KernelTime | None) -> tuple[Verdict, list[str], list[Finding]]:
    ev, fs = [], []
    if bd is not None:
        ev.append(f"mean step {bd.step_us:.1f} us over {bd.steps} step(s) ({bd.source}): computing {bd.computing_share:.1%}, "
                  f"uncovered communication {bd.communication_share:.1%}, free {bd.free_share:.1%}")
    if kt is not None:
        ev.append(f"kernel time {kt.total_us:.1f} us in {kt.kernels} kernels: cube {kt.cube_share:.1%}, vector "
                  f"{kt.vector_share:.1%}, AI CPU {kt.aicpu_share:.1%} of computing kernels; communication "
                  f"{kt.communication_us:.1f} us")
    if bd is not None and bd.communication_share > COMM_BOUND_SHARE and bd.communication_share >= bd.free_share:
        ev.append(f"uncovered communication {bd.communication_share:.1%} > {COMM_BOUND_SHARE:.0%} and >= free")
        fs.append(Finding(rule="communication", severity="high", value=bd.communication_share,
                          message=(f"{bd.communication_share:.1%} of the step is communication not hidden by computing: "
                                   "overlap it (bucketed/async all-reduce), communicate less often or in bf16, and "
                                   "check for a slow rank")))
        return "communication-bound", ev, fs
    if bd is not None and bd.free_share > HOST_BOUND_FREE_SHARE:
        ev.append(f"free {bd.free_share:.1%} > {HOST_BOUND_FREE_SHARE:.0%} of the step (advisor rule): the device waits for the host")
        fs.append(Finding(rule="free_time", severity="high", suggestion="TASK_QUEUE_ENABLE", value=bd.free_share,
                          message=(f"device idle {bd.free_share:.1%} of the step: set TASK_QUEUE_ENABLE=2, fuse small "
                                   "operators (see the affinity findings), remove host syncs, or raise the micro-batch")))
        fs.append(Finding(rule="free_time.affinity", severity="medium", suggestion="CPU_AFFINITY_CONF", value=bd.free_share,
                          message="bind the hot host threads to cores: CPU_AFFINITY_CONF=2"))
        return "host-bound", ev, fs
    if kt is not None and kt.cube_share + kt.vector_share + kt.aicpu_share > 0:
        if kt.cube_share >= SHARE_THRESHOLD:
            ev.append(f"cube share {kt.cube_share:.1%} >= {SHARE_THRESHOLD:.0%}: matmul/attention engines dominate")
            return "compute-bound", ev, fs
        if kt.vector_share + kt.aicpu_share >= SHARE_THRESHOLD:
            ev.append(f"vector + AI CPU share {kt.vector_share + kt.aicpu_share:.1%} >= {SHARE_THRESHOLD:.0%}: "
                      "elementwise/reduction kernels dominate (memory traffic); fusion helps")
            return "memory-bound", ev, fs
    elif bd is not None:
        ev.append("no kernel_details.csv: computing cannot be split into cube and vector")
    return "unknown", ev, fs


def with_pattern(finding: Finding) -> Finding:
    """The finding with the registry pattern of the catalog entry it suggests (none for a bare verdict)."""
    if finding.suggestion is None or finding.pattern is not None:
        return finding
    try:
        return finding.model_copy(update={"pattern": npu_catalog.entry(finding.suggestion).pattern})
    except KeyError:
        return finding


def analyse_ascend(profile: AscendProfile | str | Path, env: Mapping[str, str] | None = None, *,
                   top: int = 10) -> AscendProfileReport:
    """Report for a parsed profile (or a folder path); `env` adds the environment checks."""
    prof = profile if isinstance(profile, AscendProfile) else load_ascend_profile(profile)
    bd = step_breakdown(prof.step_trace or []) or kernel_breakdown(prof.kernels or [])
    kt = kernel_time(prof.kernels or [])
    verdict, evidence, findings = _verdict(bd, kt)
    findings += aicpu_ops(prof.kernels, prof.op_stats)
    findings += bound_ops(prof.kernels)
    findings += matmul_alignment(prof.kernels)
    findings += affinity_matches(prof.trace_events, prof.operator_details)
    findings += schedule_check(prof.trace_events)
    if env is not None:
        findings += check_environment(env)
    findings = [with_pattern(f) for f in findings]
    if prof.files_missing:
        evidence.append(f"missing: {', '.join(prof.files_missing)} (analysed the rest)")
    tops = sorted(prof.op_stats or [], key=lambda s: -s.total_us)[:top]
    return AscendProfileReport(
        path=prof.path, schema_version=prof.schema_version, verdict=verdict, evidence=evidence, findings=findings,
        breakdown=bd, kernel_time=kt, top_op_types=tops, files_present=prof.files_present,
        files_missing=prof.files_missing, skipped_rows=prof.skipped_rows, warnings=prof.warnings)


_DATA = ("step_trace", "kernels", "op_stats", "operator_details", "trace_events")


def analyse_ranks(path: str | Path, env: Mapping[str, str] | None = None, *,
                  top: int = 10) -> list[tuple[Path, AscendProfileReport | AscendProfileError]]:
    """One report per ASCEND_PROFILER_OUTPUT folder found for `path` (one per rank under a parent).

    A rank whose folder gives nothing readable yields its error in place of a report, so the
    other ranks are still analysed; `path` itself holding no profiler output raises.
    """
    out: list[tuple[Path, AscendProfileReport | AscendProfileError]] = []
    for d in find_output_dirs(path):
        try:
            prof = load_ascend_profile(d)
            if all(getattr(prof, a) is None for a in _DATA):
                raise AscendProfileError(f"{prof.path}: no file could be read ({'; '.join(prof.warnings)})")
            out.append((d, analyse_ascend(prof, env, top=top)))
        except AscendProfileError as e:
            out.append((d, e))
    return out
