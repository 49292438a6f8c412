"""Finding a torch_npu profiler output folder and reading its CSV / JSON files into rows.

The external format is versioned (`SCHEMA`): a file lacking a required column is not
analysed, optional columns are read when present, malformed rows are skipped and counted,
and every such problem is recorded in `AscendProfile.warnings`.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

from .models import (
    AscendProfile,
    AscendProfileError,
    KernelRow,
    OperatorDetailRow,
    OpStatRow,
    PyTorchTraceOnly,
    StepTraceRow,
    TraceEvent,
)

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


def _no_output(p: Path) -> AscendProfileError:
    """Why `p` holds nothing to analyse, with the nearest thing that might have been meant."""
    traces = sorted(q.name for q in p.glob("*.pt.trace.json"))
    if traces:
        return PyTorchTraceOnly(
            f"{p}: holds a PyTorch profiler trace ({traces[0]}{f' and {len(traces) - 1} more' if len(traces) > 1 else ''}), "
            f"not a torch_npu *_ascend_pt folder; only Ascend profiler folders are analysed by this command yet")
    deeper = sorted(q.relative_to(p) for q in p.glob(f"*/*_ascend_pt/{OUTPUT_DIR}") if q.is_dir())
    more = f" and {len(deeper) - 3} more" if len(deeper) > 3 else ""
    hint = (f"; found deeper: {', '.join(str(q.parent) for q in deeper[:3])}{more}: give one of those folders "
            "or its parent") if deeper else "; was the profiler run with tensorboard_trace_handler(dir)?"
    return AscendProfileError(
        f"{p}: no torch_npu profiler output found (expected *_ascend_pt/{OUTPUT_DIR}/ with "
        f"{', '.join(FILES)}){hint}")


def find_output_dirs(path: str | Path) -> list[Path]:
    """Every ASCEND_PROFILER_OUTPUT folder for `path`: the folder itself, its *_ascend_pt folder,
    or one per *_ascend_pt folder (one per rank) of a parent, in name order."""
    p = Path(path)
    if not p.exists():
        raise AscendProfileError(f"{p}: no such folder")
    if not p.is_dir():
        if p.name.endswith(".trace.json"):
            raise PyTorchTraceOnly(f"{p}: a PyTorch profiler trace, not a torch_npu *_ascend_pt folder; "
                                   "only Ascend profiler folders are analysed by this command yet")
        raise AscendProfileError(f"{p}: not a folder (give the *_ascend_pt folder or its parent)")
    if p.name == OUTPUT_DIR:
        return [p]
    if (p / OUTPUT_DIR).is_dir():
        return [p / OUTPUT_DIR]
    found = sorted(q for q in p.glob(f"*_ascend_pt/{OUTPUT_DIR}") if q.is_dir())
    if found:
        return found
    if any((p / f).is_file() for f in FILES):
        return [p]
    raise _no_output(p)


def find_output_dir(path: str | Path) -> tuple[Path, list[str]]:
    """The ASCEND_PROFILER_OUTPUT folder for `path` (itself, a *_ascend_pt folder, or a parent)."""
    p = Path(path)
    found = find_output_dirs(p)
    if len(found) > 1:
        return found[0], [f"{len(found)} *_ascend_pt folders under {p}: analysing {found[0].parent.name} only"]
    if found[0] == p and p.name != OUTPUT_DIR:
        return p, [f"{p} holds profiler files directly (no *_ascend_pt/{OUTPUT_DIR} layout)"]
    return found[0], []


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
    try:
        return _read_csv_rows(path, spec, prof)
    except (UnicodeDecodeError, csv.Error, OSError) as e:
        prof.warnings.append(f"{path.name}: not readable as a UTF-8 CSV ({type(e).__name__}: {e}): file not analysed")
        return None


def _read_csv_rows(path: Path, spec: dict, prof: AscendProfile) -> list[dict[str, str]] | None:
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
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
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
