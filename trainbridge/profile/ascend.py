"""Offline analysis of a torch_npu.profiler output folder, the Ascend side of `ProfileReport`.

Why offline and stateless: profiling must not slow or crash training, and the same folder
must always give the same report. `load_ascend_profile(path)` parses
`*_ascend_pt/ASCEND_PROFILER_OUTPUT/` (step_trace_time.csv, kernel_details.csv,
op_statistic.csv, operator_details.csv, trace_view.json) into typed rows against a
versioned schema (`SCHEMA`); missing optional files are listed, malformed rows are skipped
and counted. The analyzers (`step_breakdown`, `kernel_time`, `aicpu_ops`, `bound_ops`,
`matmul_alignment`, `affinity_matches`, `schedule_check`, `check_environment`) are pure
functions of those rows; `analyse_ascend` joins them into an `AscendProfileReport` whose
verdict uses the msprof-analyze advisor's thresholds (docs/npu.md) and
whose suggestions name entries of trainbridge/targets/npu_catalog.json.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from .analysis import Verdict

SCHEMA_VERSION = "torch_npu.profiler.ascend_pt/1"

# The external format, versioned: required columns must be present (else the file is
# unusable), optional ones are read when present; aliases are spellings seen in the docs.
SCHEMA: dict[str, dict[str, list[str]]] = {
    "step_trace_time.csv": {
        "required": ["Step", "Computing", "Communication(Not Overlapped)", "Free"],
        "optional": ["Device_id", "Overlapped", "Communication", "Stage", "Bubble",
                     "Communication(Not Overlapped and Exclude Receive)", "Preparing"],
    },
    "kernel_details.csv": {
        "required": ["Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)"],
        "optional": ["Step Id", "Device_id", "Wait Time(us)", "Block Dim", "Input Shapes", "Input Data Types",
                     "Input Formats", "Output Shapes", "Output Data Types", "Output Formats"],
    },
    "op_statistic.csv": {
        "required": ["OP Type", "Core Type", "Count", "Total Time(us)"],
        "optional": ["Device_id", "Min Time(us)", "Avg Time(us)", "Max Time(us)", "Ratio(%)"],
    },
    "operator_details.csv": {
        "required": ["Name"],
        "optional": ["Input Shapes", "Call Stack", "Host Self Duration(us)", "Host Total Duration(us)",
                     "Device Self Duration(us)", "Device Total Duration(us)"],
    },
    "trace_view.json": {"required": [], "optional": []},
}
ALIASES = {"Block Num": "Block Dim", "Step ID": "Step Id"}
FILES = tuple(SCHEMA)
OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"

HOST_BOUND_FREE_SHARE = 0.10    # advisor: free > 10% of the step
COMM_BOUND_SHARE = 0.20         # uncovered communication share that dominates a step
SHARE_THRESHOLD = 0.5           # cube vs vector share of kernel time (as in analysis.py)
AICPU_US = 20.0                 # advisor: AICPU operators over 20 us
BOUND_RATIO = 0.8               # advisor: mte2 / mac / vec ratio over 0.8
MATMUL_ALIGN = 256              # advisor: matmul inner axis not a multiple of 256
ACLOP_COMPILE_CALLS = 20        # advisor: >= 20 aclopCompileAndExecute => jit_compile=False
ACLNN_CACHE_MIN = 10000

CUBE_TYPE = re.compile(r"matmul|conv|flashattention|gemm|grouped_?matmul", re.I)
COMM_TYPE = re.compile(r"^hcom|hccl|allreduce|allgather|reducescatter|alltoall|broadcast", re.I)


class AscendProfileError(ValueError):
    """The folder cannot be analysed at all (absent, empty, no torch_npu profiler files)."""


# --- parsed rows -------------------------------------------------------------------------------

class StepTraceRow(BaseModel):
    device_id: int | None = None
    step: str | None = None
    computing_us: float
    communication_not_overlapped_us: float
    overlapped_us: float | None = None
    communication_us: float | None = None
    free_us: float
    stage_us: float | None = None
    bubble_us: float | None = None
    preparing_us: float | None = None

    @property
    def step_us(self) -> float:
        """Computing + uncovered communication + free: the advisor's split of one step."""
        return self.computing_us + self.communication_not_overlapped_us + self.free_us


class KernelRow(BaseModel):
    step_id: int | None = None
    device_id: int | None = None
    name: str
    type: str
    accelerator_core: str
    start_us: float
    duration_us: float
    wait_us: float | None = None
    block_dim: int | None = None
    input_shapes: str | None = None
    input_dtypes: str | None = None
    ratios: dict[str, float] = Field(default_factory=dict, description="aic_* / aiv_* *_ratio columns present")

    @property
    def category(self) -> Literal["cube", "vector", "aicpu", "communication"]:
        core = self.accelerator_core.upper()
        if core in ("HCCL", "COMMUNICATION") or COMM_TYPE.search(self.type) or self.name.lower().startswith("hcom"):
            return "communication"
        if core == "AI_CPU":
            return "aicpu"
        if CUBE_TYPE.search(self.type):
            return "cube"
        return "vector"


class OpStatRow(BaseModel):
    op_type: str
    core_type: str
    count: int
    total_us: float
    min_us: float | None = None
    avg_us: float | None = None
    max_us: float | None = None
    ratio_pct: float | None = None


class OperatorDetailRow(BaseModel):
    name: str
    input_shapes: str | None = None
    call_stack: list[str] = Field(default_factory=list, description="frames 'file(line): func', innermost first")
    host_self_us: float | None = None
    device_self_us: float | None = None


class TraceEvent(BaseModel):
    name: str
    ts_us: float
    dur_us: float
    pid: str
    tid: str
    cat: str | None = None
    call_stack: list[str] = Field(default_factory=list)


class AscendProfile(BaseModel):
    """One parsed ASCEND_PROFILER_OUTPUT folder; None for a file that is absent or unusable."""

    path: str
    schema_version: str = SCHEMA_VERSION
    files_present: list[str]
    files_missing: list[str]
    step_trace: list[StepTraceRow] | None = None
    kernels: list[KernelRow] | None = None
    op_stats: list[OpStatRow] | None = None
    operator_details: list[OperatorDetailRow] | None = None
    trace_events: list[TraceEvent] | None = None
    skipped_rows: dict[str, int] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)


# --- report ------------------------------------------------------------------------------------

Severity = Literal["high", "medium", "low", "info"]


class Finding(BaseModel):
    rule: str
    severity: Severity
    message: str
    suggestion: str | None = Field(None, description="a catalog entry name (operator, optimizer or knob)")
    source_lines: list[str] = Field(default_factory=list, description="'file:line' of the user code, when known")
    ops: list[str] = Field(default_factory=list, description="the operators / kernel types concerned")
    count: int | None = None
    value: float | None = Field(None, description="the number the rule fired on (unit in the rule's message)")


class StepBreakdown(BaseModel):
    source: Literal["step_trace_time.csv", "kernel_details.csv"]
    steps: int
    step_us: float = Field(..., description="mean step: computing + uncovered communication + free")
    computing_us: float
    communication_us: float = Field(..., description="communication not overlapped by computing")
    free_us: float
    computing_share: float
    communication_share: float
    free_share: float


class KernelTime(BaseModel):
    """Device kernel time by engine, over all kernels of the profile."""

    total_us: float
    cube_us: float
    vector_us: float
    aicpu_us: float
    communication_us: float
    cube_share: float = Field(..., description="of computing kernel time (communication excluded)")
    vector_share: float
    aicpu_share: float
    kernels: int


class AscendProfileReport(BaseModel):
    path: str
    schema_version: str
    verdict: Verdict
    evidence: list[str]
    findings: list[Finding]
    breakdown: StepBreakdown | None = None
    kernel_time: KernelTime | None = None
    top_op_types: list[OpStatRow] = Field(default_factory=list)
    files_present: list[str]
    files_missing: list[str]
    skipped_rows: dict[str, int] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)

    def by_rule(self, prefix: str) -> list[Finding]:
        return [f for f in self.findings if f.rule == prefix or f.rule.startswith(prefix + ".")]


# --- loading -----------------------------------------------------------------------------------

def find_output_dir(path: str | Path) -> tuple[Path, list[str]]:
    """The ASCEND_PROFILER_OUTPUT folder for `path` (itself, a *_ascend_pt folder, or a parent)."""
    p = Path(path)
    if not p.exists():
        raise AscendProfileError(f"{p}: no such folder")
    if not p.is_dir():
        raise AscendProfileError(f"{p}: not a folder (give the *_ascend_pt folder or its parent)")
    if p.name == OUTPUT_DIR:
        return p, []
    if (p / OUTPUT_DIR).is_dir():
        return p / OUTPUT_DIR, []
    found = sorted(q for q in p.glob(f"*_ascend_pt/{OUTPUT_DIR}") if q.is_dir())
    if found:
        notes = [f"{len(found)} *_ascend_pt folders under {p}: analysing {found[0].parent.name} only"] if len(found) > 1 else []
        return found[0], notes
    if any((p / f).is_file() for f in FILES):
        return p, [f"{p} holds profiler files directly (no *_ascend_pt/{OUTPUT_DIR} layout)"]
    raise AscendProfileError(
        f"{p}: no torch_npu profiler output found (expected *_ascend_pt/{OUTPUT_DIR}/ with "
        f"{', '.join(FILES)}); was the profiler run with tensorboard_trace_handler(dir)?")


def _clean(v: str | None) -> str | None:
    if v is None:
        return None
    v = v.strip().strip("\t").strip().strip('"').strip()
    return None if v in ("", "N/A", "NA", "-") else v


def _num(v: str | None, *, required: bool = False) -> float | None:
    c = _clean(v)
    if c is None:
        if required:
            raise ValueError("missing value")
        return None
    x = float(c)
    if not math.isfinite(x):
        raise ValueError(f"non-finite {c}")
    return x


def _int(v: str | None) -> int | None:
    x = _num(v)
    return None if x is None else int(x)


def _read_csv(path: Path, spec: dict, prof: AscendProfile) -> list[dict[str, str]] | None:
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        try:
            header = [ALIASES.get(h.strip(), h.strip()) for h in next(reader)]
        except StopIteration:
            prof.warnings.append(f"{path.name}: empty file")
            return None
        missing = [c for c in spec["required"] if c not in header]
        if missing:
            prof.warnings.append(f"{path.name}: lacks required columns {missing}: file not analysed")
            return None
        rows, bad = [], 0
        for rec in reader:
            if not any(x.strip() for x in rec):
                continue
            if len(rec) != len(header):
                bad += 1
                continue
            rows.append(dict(zip(header, rec)))
        if bad:
            prof.skipped_rows[path.name] = prof.skipped_rows.get(path.name, 0) + bad
        return rows


def _parse_rows(name: str, raw: list[dict[str, str]], make, prof: AscendProfile) -> list:
    out, bad = [], 0
    for r in raw:
        try:
            out.append(make(r))
        except (ValueError, TypeError, KeyError):
            bad += 1
    if bad:
        prof.skipped_rows[name] = prof.skipped_rows.get(name, 0) + bad
    return out


def _step_row(r: dict[str, str]) -> StepTraceRow:
    return StepTraceRow(
        device_id=_int(r.get("Device_id")), step=_clean(r.get("Step")),
        computing_us=_num(r["Computing"], required=True),
        communication_not_overlapped_us=_num(r["Communication(Not Overlapped)"], required=True),
        overlapped_us=_num(r.get("Overlapped")), communication_us=_num(r.get("Communication")),
        free_us=_num(r["Free"], required=True), stage_us=_num(r.get("Stage")), bubble_us=_num(r.get("Bubble")),
        preparing_us=_num(r.get("Preparing")))


def _kernel_row(r: dict[str, str]) -> KernelRow:
    ratios = {}
    for k, v in r.items():
        if k.startswith(("aic_", "aiv_")) and k.endswith("_ratio"):
            x = _num(v)
            if x is not None:
                ratios[k] = x
    name, typ, core = _clean(r["Name"]), _clean(r["Type"]), _clean(r["Accelerator Core"])
    if not name or not typ or not core:
        raise ValueError("kernel row without name/type/core")
    return KernelRow(
        step_id=_int(r.get("Step Id")), device_id=_int(r.get("Device_id")), name=name, type=typ,
        accelerator_core=core, start_us=_num(r["Start Time(us)"], required=True),
        duration_us=_num(r["Duration(us)"], required=True), wait_us=_num(r.get("Wait Time(us)")),
        block_dim=_int(r.get("Block Dim")), input_shapes=_clean(r.get("Input Shapes")),
        input_dtypes=_clean(r.get("Input Data Types")), ratios=ratios)


def _opstat_row(r: dict[str, str]) -> OpStatRow:
    op = _clean(r["OP Type"])
    if not op:
        raise ValueError("no op type")
    return OpStatRow(op_type=op, core_type=_clean(r["Core Type"]) or "", count=int(_num(r["Count"], required=True)),
                     total_us=_num(r["Total Time(us)"], required=True), min_us=_num(r.get("Min Time(us)")),
                     avg_us=_num(r.get("Avg Time(us)")), max_us=_num(r.get("Max Time(us)")),
                     ratio_pct=_num(r.get("Ratio(%)")))


_FRAME_SPLIT = re.compile(r"[;\r\n]+")


def _frames(text: str | None) -> list[str]:
    return [f.strip() for f in _FRAME_SPLIT.split(text or "") if f.strip()]


def _opdetail_row(r: dict[str, str]) -> OperatorDetailRow:
    name = _clean(r["Name"])
    if not name:
        raise ValueError("no name")
    return OperatorDetailRow(name=name, input_shapes=_clean(r.get("Input Shapes")),
                             call_stack=_frames(r.get("Call Stack")),
                             host_self_us=_num(r.get("Host Self Duration(us)")),
                             device_self_us=_num(r.get("Device Self Duration(us)")))


def _trace_events(path: Path, prof: AscendProfile) -> list[TraceEvent] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        prof.warnings.append(f"trace_view.json: not valid JSON ({e.msg if hasattr(e, 'msg') else e}): file not analysed")
        return None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        prof.warnings.append("trace_view.json: no event list (expected a list or {'traceEvents': [...]})")
        return None
    out, bad = [], 0
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue  # metadata, counters, flows
        try:
            args = ev.get("args") or {}
            stack = args.get("Call stack") or args.get("Call Stack") if isinstance(args, dict) else None
            out.append(TraceEvent(name=str(ev["name"]), ts_us=float(ev["ts"]), dur_us=float(ev.get("dur", 0.0)),
                                  pid=str(ev.get("pid", "")), tid=str(ev.get("tid", "")), cat=ev.get("cat"),
                                  call_stack=_frames(stack)))
        except (KeyError, ValueError, TypeError):
            bad += 1
    if bad:
        prof.skipped_rows["trace_view.json"] = bad
    return out


def load_ascend_profile(path: str | Path) -> AscendProfile:
    """Parse every known file of the folder; a clear AscendProfileError when there is nothing to read."""
    out_dir, notes = find_output_dir(path)
    present = [f for f in FILES if (out_dir / f).is_file()]
    if not present:
        raise AscendProfileError(f"{out_dir}: none of {', '.join(FILES)} is present")
    prof = AscendProfile(path=str(out_dir), files_present=present,
                         files_missing=[f for f in FILES if f not in present], warnings=notes)
    makers = {"step_trace_time.csv": ("step_trace", _step_row), "kernel_details.csv": ("kernels", _kernel_row),
              "op_statistic.csv": ("op_stats", _opstat_row), "operator_details.csv": ("operator_details", _opdetail_row)}
    for fname, (attr, make) in makers.items():
        if fname in present:
            raw = _read_csv(out_dir / fname, SCHEMA[fname], prof)
            if raw is not None:
                setattr(prof, attr, _parse_rows(fname, raw, make, prof))
    if "trace_view.json" in present:
        prof.trace_events = _trace_events(out_dir / "trace_view.json", prof)
    for fname, n in sorted(prof.skipped_rows.items()):
        prof.warnings.append(f"{fname}: skipped {n} malformed row(s)")
    return prof


# --- analyzers (pure functions of parsed rows) -------------------------------------------------

def _breakdown(source, steps: int, comp: float, comm: float, free: float) -> StepBreakdown:
    total = comp + comm + free
    sh = (lambda x: x / total) if total > 0 else (lambda x: 0.0)
    return StepBreakdown(source=source, steps=steps, step_us=total / steps, computing_us=comp / steps,
                         communication_us=comm / steps, free_us=free / steps, computing_share=sh(comp),
                         communication_share=sh(comm), free_share=sh(free))


def step_breakdown(rows: list[StepTraceRow]) -> StepBreakdown | None:
    """Mean computing / uncovered communication / free per step from step_trace_time.csv."""
    if not rows:
        return None
    return _breakdown("step_trace_time.csv", len(rows), sum(r.computing_us for r in rows),
                      sum(r.communication_not_overlapped_us for r in rows), sum(r.free_us for r in rows))


def _union(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def kernel_breakdown(kernels: list[KernelRow]) -> StepBreakdown | None:
    """The same split from kernel timestamps when step_trace_time.csv is absent.

    Per step (Step Id, else the whole profile): free = span - union(all kernels); computing =
    union(compute kernels); communication = union(all) - union(compute) (the uncovered part).
    """
    if not kernels:
        return None
    groups: dict[int | None, list[KernelRow]] = defaultdict(list)
    for k in kernels:
        groups[k.step_id].append(k)
    comp = comm = free = 0.0
    for ks in groups.values():
        span = max(k.start_us + k.duration_us for k in ks) - min(k.start_us for k in ks)
        busy = _union((k.start_us, k.start_us + k.duration_us) for k in ks)
        c = _union((k.start_us, k.start_us + k.duration_us) for k in ks if k.category != "communication")
        comp, comm, free = comp + c, comm + (busy - c), free + (span - busy)
    return _breakdown("kernel_details.csv", len(groups), comp, comm, free)


def kernel_time(kernels: list[KernelRow]) -> KernelTime | None:
    if not kernels:
        return None
    by = defaultdict(float)
    for k in kernels:
        by[k.category] += k.duration_us
    computing = by["cube"] + by["vector"] + by["aicpu"]
    sh = (lambda x: x / computing) if computing > 0 else (lambda x: 0.0)
    return KernelTime(total_us=computing + by["communication"], cube_us=by["cube"], vector_us=by["vector"],
                      aicpu_us=by["aicpu"], communication_us=by["communication"], cube_share=sh(by["cube"]),
                      vector_share=sh(by["vector"]), aicpu_share=sh(by["aicpu"]), kernels=len(kernels))


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
        if not re.search(r"matmul", k.type, re.I) or not k.input_shapes:
            continue
        kk = matmul_inner_axis(k.input_shapes)
        if kk is not None and kk % MATMUL_ALIGN:
            groups[(k.type, k.input_shapes, kk)].append(k)
    return [Finding(rule="matmul_alignment", severity="low", ops=[t], count=len(ks), value=float(kk),
                    message=(f"{t} with input shapes {shp}: inner axis K={kk} is not a multiple of {MATMUL_ALIGN} "
                             f"({len(ks)} kernel(s), {sum(k.duration_us for k in ks):.1f} us); pad K (e.g. the "
                             f"hidden or vocab size) to {math.ceil(kk / MATMUL_ALIGN) * MATMUL_ALIGN}"))
            for (t, shp, kk), ks in sorted(groups.items(), key=lambda kv: -sum(k.duration_us for k in kv[1]))]


# affinity patterns over top-level aten call sequences (advisor rules; docs/npu.md)
_CHUNK = r"(?:(?:chunk|slice|split|narrow) )+"
AFFINITY: tuple[tuple[str, str, str], ...] = (
    ("rms_norm", r"pow mean add rsqrt mul ", "npu_rms_norm"),
    ("rotary", _CHUNK + r"neg cat (?:mul )?add ", "npu_rotary_mul"),
    ("attention", r"matmul (?:(?!matmul )\S+ ){0,4}?softmax (?:(?!matmul )\S+ ){0,2}?matmul ", "npu_fusion_attention"),
    ("swiglu", _CHUNK + r"silu mul ", "npu_swiglu"),
    ("geglu", _CHUNK + r"gelu mul ", "npu_geglu"),
    ("confusion_transpose", r"(?:permute|transpose) contiguous (?:reshape|view) ", "npu_confusion_transpose"),
    ("scaled_masked_softmax", r"(?:(?:mul|div) (?:masked_fill|add) |(?:masked_fill|add) (?:mul|div) )softmax ",
     "npu_scaled_masked_softmax"),
)
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#(?P<cls>\w+)\.step$|^(?P<cls2>\w+)\.step$")
FUSED_OPTIMIZER = {"AdamW": "NpuFusedAdamW", "Adam": "NpuFusedAdam", "SGD": "NpuFusedSGD"}
_LIB_FRAME = re.compile(r"site-packages|dist-packages|/torch/|torch_npu|<built-in|<frozen|threading\.py|runpy\.py")
_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\)")


def _token(name: str) -> str:
    t = name[len("aten::"):]
    return t[:-1] if t.endswith("_") and not t.startswith("_") else t


def top_level_aten(events: list[TraceEvent]) -> dict[tuple[str, str], list[TraceEvent]]:
    """Per (pid, tid), aten:: events not nested in another aten:: event, in time order."""
    threads: dict[tuple[str, str], list[TraceEvent]] = defaultdict(list)
    for e in events:
        if e.name.startswith("aten::"):
            threads[(e.pid, e.tid)].append(e)
    out = {}
    for key, evs in threads.items():
        evs.sort(key=lambda e: (e.ts_us, -e.dur_us))
        top, end = [], -math.inf
        for e in evs:
            if e.ts_us >= end:
                top.append(e)
                end = e.ts_us + e.dur_us
        out[key] = top
    return out


def _user_frame(stack: list[str]) -> tuple[str, int] | None:
    for fr in stack:
        mm = _FRAME.match(fr)
        if mm and not _LIB_FRAME.search(mm.group("file")):
            return mm.group("file"), int(mm.group("line"))
    return None


def _lines_from_details(names: list[str], details: list[OperatorDetailRow] | None, window: int = 15) -> list[str]:
    """User lines for an op sequence from operator_details' aggregated call stacks.

    Rows are aggregated per call site, so a sequence is placed by chaining each op to the
    nearest call site at or after the previous op's line (same file, within `window`);
    every anchor that places the whole sequence is reported (ambiguity stays visible).
    """
    if not details:
        return []
    sites: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for d in details:
        fr = _user_frame(d.call_stack)
        if fr:
            sites[d.name].add(fr)
    wanted = names
    if not sites.get(wanted[0]):
        return []
    hits: set[str] = set()
    for anchor in sorted(sites[wanted[0]]):
        chain, prev = [anchor], anchor
        for n in wanted[1:]:
            cands = [c for c in sites.get(n, ()) if c[0] == prev[0] and abs(c[1] - prev[1]) <= window]
            if not cands:
                chain = None
                break
            prev = min(cands, key=lambda c: (c[1] < prev[1], abs(c[1] - prev[1])))
            chain.append(prev)
        if chain:
            hits.update(f"{f}:{ln}" for f, ln in chain)
    return sorted(hits, key=lambda s: (s.rsplit(":", 1)[0], int(s.rsplit(":", 1)[1])))


def _source_lines(evs: list[TraceEvent], details: list[OperatorDetailRow] | None) -> list[str]:
    own = [_user_frame(e.call_stack) for e in evs if e.call_stack]
    own = [f for f in own if f]
    if own:
        return sorted({f"{f}:{ln}" for f, ln in own}, key=lambda s: (s.rsplit(":", 1)[0], int(s.rsplit(":", 1)[1])))
    return _lines_from_details([e.name for e in evs], details)


def affinity_matches(events: list[TraceEvent] | None, details: list[OperatorDetailRow] | None = None) -> list[Finding]:
    """The advisor's fused-API patterns on top-level aten sequences, mapped to source lines."""
    if not events:
        return []
    found: dict[str, dict] = {}
    for key, top in sorted(top_level_aten(events).items()):
        text, starts = "", []
        for e in top:
            starts.append(len(text))
            text += _token(e.name) + " "
        idx = {s: i for i, s in enumerate(starts)}
        spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for rule, rx, _ in AFFINITY:
            for mm in re.finditer(r"(?:(?<= )|^)(" + rx + ")", text):
                a = mm.start(1)
                if a not in idx:
                    continue
                i = idx[a]
                j = i + mm.group(1).count(" ")
                if rule == "scaled_masked_softmax" and any(s <= i < e for s, e in spans["attention"]):
                    continue  # part of a full attention block: npu_fusion_attention covers it
                spans[rule].append((i, j))
                rec = found.setdefault(rule, {"count": 0, "lines": set(), "seq": None, "threads": set()})
                rec["count"] += 1
                rec["threads"].add(key[1])
                rec["seq"] = rec["seq"] or mm.group(1).split()
                rec["lines"].update(_source_lines(top[i:j], details))
    out = []
    for rule, rx, sugg in AFFINITY:
        if rule not in found:
            continue
        rec = found[rule]
        lines = sorted(rec["lines"], key=lambda s: (s.rsplit(":", 1)[0], int(s.rsplit(":", 1)[1])))
        out.append(Finding(
            rule=f"affinity.{rule}", severity="medium", suggestion=sugg, source_lines=lines, count=rec["count"],
            ops=["aten::" + t for t in rec["seq"]],
            message=(f"aten sequence {' -> '.join(rec['seq'])} seen {rec['count']} time(s) matches the advisor's "
                     f"{sugg} pattern" + (f" at {', '.join(lines)}" if lines else " (no call stacks recorded: "
                                          "profile with with_stack=True to get source lines)"))))
    out.extend(_optimizer_findings(events, details))
    return out


def _optimizer_findings(events: list[TraceEvent], details: list[OperatorDetailRow] | None) -> list[Finding]:
    steps: dict[str, list[TraceEvent]] = defaultdict(list)
    for e in events:
        mm = OPTIMIZER_STEP.match(e.name)
        if mm:
            steps[mm.group("cls") or mm.group("cls2")].append(e)
    out = []
    for cls, evs in sorted(steps.items()):
        if cls.startswith("NpuFused") or cls == "Optimizer":
            continue
        sugg = FUSED_OPTIMIZER.get(cls)
        lines = _source_lines(evs, None) or _lines_from_details([evs[0].name], details)
        mean_us = sum(e.dur_us for e in evs) / len(evs)
        out.append(Finding(
            rule="affinity.optimizer", severity="medium", suggestion=sugg, source_lines=lines, count=len(evs),
            ops=[evs[0].name], value=mean_us,
            message=(f"{cls}.step: {len(evs)} call(s), {mean_us:.1f} us each on the host: "
                     + (f"torch_npu.optim.{sugg} updates all parameters in one fused pass (mind its caveats)"
                        if sugg else "no fused torch_npu equivalent in the catalog; a fused/foreach form may help"))))
    return out


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


# --- front door --------------------------------------------------------------------------------

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
    if prof.files_missing:
        evidence.append(f"missing: {', '.join(prof.files_missing)} (analysed the rest)")
    tops = sorted(prof.op_stats or [], key=lambda s: -s.total_us)[:top]
    return AscendProfileReport(
        path=prof.path, schema_version=prof.schema_version, verdict=verdict, evidence=evidence, findings=findings,
        breakdown=bd, kernel_time=kt, top_op_types=tops, files_present=prof.files_present,
        files_missing=prof.files_missing, skipped_rows=prof.skipped_rows, warnings=prof.warnings)


__all__ = [
    "SCHEMA_VERSION", "SCHEMA", "AscendProfileError", "StepTraceRow", "KernelRow", "OpStatRow", "OperatorDetailRow",
    "TraceEvent", "AscendProfile", "Finding", "StepBreakdown", "KernelTime", "AscendProfileReport",
    "find_output_dir", "load_ascend_profile", "step_breakdown", "kernel_breakdown", "kernel_time", "aicpu_ops",
    "bound_ops", "matmul_inner_axis", "matmul_alignment", "top_level_aten", "affinity_matches", "schedule_check",
    "check_environment", "analyse_ascend",
]
