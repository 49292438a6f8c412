"""Per-kernel and per-setting findings: AI CPU fallbacks, bound kernels, matmul alignment,
online compilation and environment knobs (the msprof-analyze advisor's rules, docs/npu.md)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping

from .models import Finding, KernelRow, OpStatRow, TraceEvent

AICPU_US = 20.0                 # advisor: AICPU operators over 20 us
BOUND_RATIO = 0.8               # advisor: mte2 / mac / vec ratio over 0.8
MATMUL_ALIGN = 256              # advisor: matmul inner axis not a multiple of 256
ACLOP_COMPILE_CALLS = 20        # advisor: >= 20 aclopCompileAndExecute => jit_compile=False
ACLNN_CACHE_MIN = 10000


def aicpu_ops(kernels: list[KernelRow] | None, op_stats: list[OpStatRow] | None = None) -> list[Finding]:
    """AI_CPU operators slower than 20 us per call (kernel_details, else op_statistic's max time)."""
    slow: dict[str, list[float]] = defaultdict(list)
    if kernels:
        for k in kernels:
            if k.accelerator_core.upper() == "AI_CPU" and k.duration_us > AICPU_US:
                slow[k.type].append(k.duration_us)
    elif op_stats:
        for s in op_stats:
            if s.core_type.upper() == "AI_CPU" and (s.max_us or s.avg_us or 0) > AICPU_US:
                slow[s.op_type] += [s.avg_us or s.total_us / max(s.count, 1)] * s.count
    out = []
    for typ, durs in sorted(slow.items(), key=lambda kv: -sum(kv[1])):
        out.append(Finding(
            rule="aicpu", severity="high", ops=[typ], count=len(durs), value=max(durs),
            message=(f"{typ} runs on the AI CPU: {len(durs)} call(s) over {AICPU_US:.0f} us, {sum(durs):.1f} us in all "
                     f"(max {max(durs):.1f} us). AI CPU fallbacks come from unsupported dtypes (int64/int16) or ops "
                     "such as IndexPut from `x[mask] = v`; rewrite (e.g. `x *= ~mask`) or cast so it runs on the AI Core")))
    return out


def bound_ops(kernels: list[KernelRow] | None) -> list[Finding]:
    """Kernels whose pipeline ratios exceed 0.8: memory (mte2), cube (mac) or vector (vec) bound."""
    if not kernels:
        return []
    groups: dict[tuple[str, str], list[KernelRow]] = defaultdict(list)
    for k in kernels:
        r = k.ratios
        if max(r.get("aic_mte2_ratio", 0.0), r.get("aiv_mte2_ratio", 0.0)) > BOUND_RATIO:
            groups[("memory", k.type)].append(k)
        elif r.get("aic_mac_ratio", 0.0) > BOUND_RATIO:
            groups[("cube", k.type)].append(k)
        elif r.get("aiv_vec_ratio", 0.0) > BOUND_RATIO:
            groups[("vector", k.type)].append(k)
    out = []
    for (kind, typ), ks in sorted(groups.items(), key=lambda kv: -sum(k.duration_us for k in kv[1])):
        us = sum(k.duration_us for k in ks)
        fp32 = any("FLOAT" == d.strip().upper() for k in ks for d in (k.input_dtypes or "").split(";"))
        if kind == "memory":
            ratio = max(max(k.ratios.get("aic_mte2_ratio", 0.0), k.ratios.get("aiv_mte2_ratio", 0.0)) for k in ks)
            msg = (f"{typ} is memory-bound (mte2 ratio {ratio:.2f} > {BOUND_RATIO}): {len(ks)} kernel(s), {us:.1f} us; "
                   "fusing it with its neighbours removes the HBM round trip")
            sugg = None
        elif kind == "cube":
            ratio = max(k.ratios.get("aic_mac_ratio", 0.0) for k in ks)
            msg = (f"{typ} is cube-bound (mac ratio {ratio:.2f} > {BOUND_RATIO}): {len(ks)} kernel(s), {us:.1f} us; "
                   + ("fp32 inputs: HF32 or bf16 would raise cube throughput (a precision change)" if fp32
                      else "less work or lower precision is what helps"))
            sugg = "allow_hf32" if fp32 else None
        else:
            ratio = max(k.ratios.get("aiv_vec_ratio", 0.0) for k in ks)
            msg = f"{typ} is vector-bound (vec ratio {ratio:.2f} > {BOUND_RATIO}): {len(ks)} kernel(s), {us:.1f} us"
            sugg = None
        out.append(Finding(rule=f"bound.{kind}", severity="medium" if kind == "memory" else "info", message=msg,
                           suggestion=sugg, ops=[typ], count=len(ks), value=ratio))
    return out


def _shapes(text: str | None) -> list[list[int]]:
    out = []
    for part in (text or "").split(";"):
        dims = [d.strip() for d in part.split(",") if d.strip()]
        try:
            out.append([int(d) for d in dims])
        except ValueError:
            out.append([])
    return out


def matmul_inner_axis(input_shapes: str | None) -> int | None:
    """K of a (batch) matmul from 'M,K;K,N' (either operand may be transposed); None if unclear."""
    sh = _shapes(input_shapes)
    if len(sh) < 2 or len(sh[0]) < 2 or len(sh[1]) < 2:
        return None
    a, b = sh[0], sh[1]
    for k in (a[-1], a[-2]):
        if k in (b[-2], b[-1]):
            return k
    return None


def matmul_alignment(kernels: list[KernelRow] | None) -> list[Finding]:
    """Matmuls whose inner (K) axis is not a multiple of 256 (advisor rule), grouped by shapes."""
    if not kernels:
        return []
    groups: dict[tuple[str, str, int], list[KernelRow]] = defaultdict(list)
    for k in kernels:
        if not re.search(r"matmul", k.type, re.IGNORECASE) or not k.input_shapes:
            continue
        kk = matmul_inner_axis(k.input_shapes)
        if kk is not None and kk % MATMUL_ALIGN:
            groups[(k.type, k.input_shapes, kk)].append(k)
    return [Finding(rule="matmul_alignment", severity="low", ops=[t], count=len(ks), value=float(kk),
                    message=(f"{t} with input shapes {shp}: inner axis K={kk} is not a multiple of {MATMUL_ALIGN} "
                             f"({len(ks)} kernel(s), {sum(k.duration_us for k in ks):.1f} us); pad K (e.g. the "
                             f"hidden or vocab size) to {math.ceil(kk / MATMUL_ALIGN) * MATMUL_ALIGN}"))
            for (t, shp, kk), ks in sorted(groups.items(), key=lambda kv: -sum(k.duration_us for k in kv[1]))]


def schedule_check(events: list[TraceEvent] | None) -> list[Finding]:
    """>= 20 aclopCompileAndExecute calls: online operator compilation; advise jit_compile=False."""
    if not events:
        return []
    n = sum(1 for e in events if e.name.rsplit("@", 1)[-1] == "aclopCompileAndExecute")
    if n < ACLOP_COMPILE_CALLS:
        return []
    return [Finding(rule="schedule.online_compile", severity="high", suggestion="set_compile_mode", count=n,
                    value=float(n), ops=["aclopCompileAndExecute"],
                    message=(f"{n} aclopCompileAndExecute calls (>= {ACLOP_COMPILE_CALLS}): operators are compiled online, "
                             "often from dynamic shapes; call torch_npu.npu.set_compile_mode(jit_compile=False) at "
                             "start-up (and keep shapes fixed or padded)"))]


def check_environment(env: Mapping[str, str]) -> list[Finding]:
    """The advisor's environment rules on a dict of environment variables."""
    out = []
    if env.get("ASCEND_LAUNCH_BLOCKING", "").strip() == "1":
        out.append(Finding(rule="env.launch_blocking", severity="high", suggestion="ASCEND_LAUNCH_BLOCKING",
                           message="ASCEND_LAUNCH_BLOCKING=1: every launch is synchronous and the task queue is off; unset it"))
    alloc = env.get("PYTORCH_NPU_ALLOC_CONF", "")
    if "expandable_segments:true" not in alloc.replace(" ", "").lower():
        out.append(Finding(rule="env.expandable_segments", severity="low", suggestion="PYTORCH_NPU_ALLOC_CONF",
                           message=(f"PYTORCH_NPU_ALLOC_CONF={alloc!r} lacks expandable_segments:True: reserved memory can "
                                    "grow far beyond allocated (fragmentation)") if alloc else
                           "PYTORCH_NPU_ALLOC_CONF is unset: set expandable_segments:True against fragmentation"))
    if "ACLNN_CACHE_LIMIT" in env:
        try:
            limit = int(env["ACLNN_CACHE_LIMIT"])
        except ValueError:
            limit = -1
        if limit < ACLNN_CACHE_MIN:
            out.append(Finding(rule="env.aclnn_cache_limit", severity="medium", suggestion="ACLNN_CACHE_LIMIT",
                               value=float(limit), message=(f"ACLNN_CACHE_LIMIT={env['ACLNN_CACHE_LIMIT']} < {ACLNN_CACHE_MIN}: "
                                                            "the host-side operator cache is too small")))
    if env.get("HOST_CACHE_CAPACITY", "").strip() == "0":
        out.append(Finding(rule="env.host_cache_capacity", severity="medium", suggestion="HOST_CACHE_CAPACITY", value=0.0,
                           message="HOST_CACHE_CAPACITY=0 disables the host cache; set e.g. 20"))
    if env.get("HCCL_ALGO", "").strip():
        out.append(Finding(rule="env.hccl_algo", severity="low", suggestion="HCCL_ALGO",
                           message=f"HCCL_ALGO={env['HCCL_ALGO']} overrides HCCL's algorithm choice; unset it unless measured"))
    lvl = env.get("ASCEND_GLOBAL_LOG_LEVEL")
    if lvl is not None and lvl.strip() != "3":
        out.append(Finding(rule="env.log_level", severity="medium", suggestion="ASCEND_GLOBAL_LOG_LEVEL",
                           message=f"ASCEND_GLOBAL_LOG_LEVEL={lvl} (not 3 = error): logging on the hot path slows the host"))
    return out
