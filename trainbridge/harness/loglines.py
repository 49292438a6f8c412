"""Read the `step:N/M ... train_time:...ms step_avg:...ms` lines Modded-NanoGPT scripts print.

The three formats are those every track-1 record log matches (modded_nanogpt.md); a
program's own timing is kept beside the harness's, never instead of it.
"""

from __future__ import annotations

import re

from .models import LogLine

_NUM = r"([\d.]+|nan)"
_PATTERNS = (
    re.compile(rf"^step:(\d+)/(\d+) val_loss:{_NUM} train_time:([\d.]+)ms step_avg:{_NUM}ms"),
    re.compile(rf"^step:(\d+)/(\d+) train_loss:{_NUM} train_time:([\d.]+)ms step_avg:{_NUM}ms"),
    re.compile(rf"^step:(\d+)/(\d+) train_time:([\d.]+)ms step_avg:{_NUM}ms"),
)


def _f(text: str) -> float | None:
    return None if text == "nan" else float(text)


def parse_line(line: str) -> LogLine | None:
    line = line.strip()
    m = _PATTERNS[0].match(line)
    if m:
        return LogLine(step=int(m[1]), total_steps=int(m[2]), val_loss=_f(m[3]),
                       train_time_ms=float(m[4]), step_avg_ms=_f(m[5]))
    m = _PATTERNS[1].match(line)
    if m:
        return LogLine(step=int(m[1]), total_steps=int(m[2]), train_loss=_f(m[3]),
                       train_time_ms=float(m[4]), step_avg_ms=_f(m[5]))
    m = _PATTERNS[2].match(line)
    if m:
        return LogLine(step=int(m[1]), total_steps=int(m[2]), train_time_ms=float(m[3]),
                       step_avg_ms=_f(m[4]))
    return None


def parse_log(text: str) -> list[LogLine]:
    return [p for p in map(parse_line, text.splitlines()) if p is not None]
