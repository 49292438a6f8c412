"""A PyTorch profiler trace the user already has (`*.pt.trace.json`), read into the operator
table and step times a live profile gives, so `trainbridge profile DIR` reports on it the
same way.

The trace is the Chrome trace `torch.profiler` writes (`export_chrome_trace` or
`tensorboard_trace_handler`): `traceEvents` with `ph: "X"` complete events. Operators are the
`cpu_op` events; an operator's self time is its duration minus that of the operators nested
directly inside it on the same thread (how the profiler's own table counts it). Device
kernels (`kernel`, `gpu_memcpy`, ...) give the device's busy time. Steps are the
`ProfilerStep#N` annotations a profiler with a schedule records at each `prof.step()`;
without them the whole trace is one window of unknown steps.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

from pydantic import BaseModel, Field

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


class TorchTraceError(ValueError):
    """A file or folder that holds no readable PyTorch profiler trace."""


class TorchTraceWindow(BaseModel):
    path: str
    step_ms: list[float] = Field(default_factory=list, description="ProfilerStep#N durations, in step order")
    window_ms: float = Field(..., description="from the first to the last operator or step annotation")
    rows: list[dict] = Field(..., description="per operator name: calls, self_cpu_us, cpu_total_us, self_device_us "
                                              "(the shape of a live profile's key_averages rows)")
    device_busy_us: float = 0.0
    skipped_events: int = Field(0, description="events without a name, start or duration")


def find_trace(path: str | Path) -> Path:
    """The trace file for `path`: the file itself, or the newest `*.pt.trace.json` in a folder."""
    p = Path(path)
    if p.is_file():
        return p
    traces = sorted(p.glob("*.pt.trace.json"), key=lambda f: f.stat().st_mtime) if p.is_dir() else []
    if not traces:
        raise TorchTraceError(f"{p}: no *.pt.trace.json (PyTorch profiler trace) found")
    return traces[-1]


def load_torch_trace(path: str | Path) -> TorchTraceWindow:
    trace = find_trace(path)
    try:
        data = json.loads(trace.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TorchTraceError(f"{trace}: not a readable JSON trace ({e})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TorchTraceError(f"{trace}: no traceEvents list")
    ops: dict[tuple, list[tuple[float, float, str]]] = defaultdict(list)
    steps: dict[int, float] = {}
    device_us, skipped, first, last = 0.0, 0, None, None
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name, ts, dur = e.get("name"), e.get("ts"), e.get("dur")
        if not isinstance(name, str) or not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            skipped += 1
            continue
        cat = str(e.get("cat", ""))
        if (m := _STEP.match(name)) is not None:
            steps[int(m.group(1))] = dur / 1e3
        elif cat == "cpu_op":
            ops[(e.get("pid"), e.get("tid"))].append((float(ts), float(dur), name))
        elif cat in DEVICE_CATEGORIES:
            device_us += dur
            continue
        else:
            continue
        first = ts if first is None else min(first, ts)
        last = ts + dur if last is None else max(last, ts + dur)
    if not ops:
        raise TorchTraceError(f"{trace}: no operator (cpu_op) events: not a torch.profiler trace, or empty")
    rows = _self_times(ops)
    return TorchTraceWindow(path=str(trace), step_ms=[steps[k] for k in sorted(steps)],
                            window_ms=((last or 0) - (first or 0)) / 1e3, rows=rows, device_busy_us=device_us,
                            skipped_events=skipped)


def _self_times(ops: dict[tuple, list[tuple[float, float, str]]]) -> list[dict]:
    """Per operator name: calls, total and self time, nesting resolved thread by thread."""
    calls: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    child: dict[str, float] = defaultdict(float)
    for events in ops.values():
        events.sort(key=lambda x: (x[0], -x[1]))
        stack: list[tuple[float, str]] = []  # (end, name) of the enclosing operators
        for ts, dur, name in events:
            while stack and stack[-1][0] <= ts:
                stack.pop()
            if stack:
                child[stack[-1][1]] += dur
            calls[name] += 1
            total[name] += dur
            stack.append((ts + dur, name))
    return [{"name": n, "calls": calls[n], "self_cpu_us": max(0.0, total[n] - child[n]), "cpu_total_us": total[n],
             "self_device_us": 0.0} for n in sorted(total, key=lambda n: -(total[n] - child[n]))]
