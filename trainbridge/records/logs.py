"""Parse one Modded-NanoGPT record log: the embedded script, extra files, `step:` lines.

Formats (shared facts in docs/records.md):
- records 4-13: the log starts with a line of 100 `=`; the script runs to the next one;
- record 14 on: the script starts at line 1 and ends at the first line of 100 `=`;
- record 61 on: extra files follow the script, each introduced by a line of 40 `-`,
  a line `# <filename>` and another line of 40 `-`;
- records 1-2 (llm.c) embed no Python; their loss lines are `s:N tel:X`.
"""

from __future__ import annotations

import ast
import re
import statistics
from pathlib import Path

from .models import ParsedLog, StepLine

SEPARATOR = "=" * 100
FILE_RULE = "-" * 40

_VAL = re.compile(r"^step:(\d+)/(\d+) val_loss:([\d.]+) train_time:(\d+)ms step_avg:([\d.]+|nan)ms$")
_TRAIN = re.compile(r"^step:(\d+)/(\d+) train_loss:([\d.]+) train_time:(\d+)ms step_avg:([\d.]+|nan)ms$")
_TIME = re.compile(r"^step:(\d+)/(\d+) train_time:(\d+)ms step_avg:([\d.]+|nan)ms$")
_TORCH = re.compile(r"^Running (?:PyTorch|pytorch) (\S+)")
_PEAK = re.compile(r"^peak memory allocated: (\d+) MiB")
_LLMC_VAL = re.compile(r"^s:(\d+) tel:([\d.]+)")


def _avg(text: str) -> float | None:
    return None if text == "nan" else float(text)


def _split_extra_files(lines: list[str]) -> tuple[list[str], dict[str, str]]:
    """Cut `---- / # name / ----` appended files off the end of a code section."""
    starts = [i for i in range(len(lines) - 2)
              if lines[i] == FILE_RULE and lines[i + 1].startswith("# ") and lines[i + 2] == FILE_RULE]
    if not starts:
        return lines, {}
    files: dict[str, str] = {}
    for k, i in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        files[lines[i + 1][2:].strip()] = "\n".join(lines[i + 3:end]).rstrip("\n") + "\n"
    return lines[: starts[0]], files


def _code_section(lines: list[str]) -> tuple[str, list[str], list[str]]:
    """(format, code lines, the rest) of a log."""
    if lines and lines[0].rstrip() == SEPARATOR:
        try:
            end = next(i for i in range(1, len(lines)) if lines[i].rstrip() == SEPARATOR)
        except StopIteration:
            return "no_code", [], lines
        return "code_between_separators", lines[1:end], lines[end + 1:]
    for i, line in enumerate(lines):
        if line.rstrip() == SEPARATOR:
            return "code_first", lines[:i], lines[i + 1:]
    return "no_code", [], lines


def parse_log(text: str, path: str = "") -> ParsedLog:
    """Everything a comparison needs from one log; never raises on odd content."""
    lines = text.splitlines()
    fmt, code, rest = _code_section(lines)
    code, extra = _split_extra_files(code)
    if fmt != "no_code" and rest and rest[0] == FILE_RULE:  # files written after the separator
        upto = next((i for i, line in enumerate(rest) if line.rstrip() == SEPARATOR), len(rest))
        _, more = _split_extra_files(rest[:upto])
        if more:
            extra.update(more)
            rest = rest[upto + 1:]
    log = ParsedLog(path=path, format=fmt, extra_files=extra)
    if fmt != "no_code" and any(line.strip() for line in code):
        log.script = "\n".join(code).rstrip("\n") + "\n"
        try:
            ast.parse(log.script)
            log.script_parses = True
        except SyntaxError:
            log.script_parses = False
    else:
        log.format = "no_code"
    for raw in rest:
        line = raw.strip()
        if m := _VAL.match(line):
            log.steps.append(StepLine(step=int(m[1]), total_steps=int(m[2]), val_loss=float(m[3]),
                                      train_time_ms=int(m[4]), step_avg_ms=_avg(m[5])))
        elif m := _TRAIN.match(line):
            log.steps.append(StepLine(step=int(m[1]), total_steps=int(m[2]), train_loss=float(m[3]),
                                      train_time_ms=int(m[4]), step_avg_ms=_avg(m[5])))
        elif m := _TIME.match(line):
            log.steps.append(StepLine(step=int(m[1]), total_steps=int(m[2]), train_time_ms=int(m[3]),
                                      step_avg_ms=_avg(m[4])))
        elif m := _TORCH.match(line):
            log.torch_version = m[1]
        elif m := _PEAK.match(line):
            log.peak_memory_mib = int(m[1])
        elif m := _LLMC_VAL.match(line):
            log.final_val_loss = float(m[2])  # llm.c: no train_time in the log
    vals = [s for s in log.steps if s.val_loss is not None]
    if vals:
        last = vals[-1]
        log.final_val_loss, log.final_train_time_ms, log.final_step_avg_ms = \
            last.val_loss, last.train_time_ms, last.step_avg_ms
    return log


def read_log(path: Path) -> ParsedLog:
    return parse_log(path.read_text(encoding="utf-8", errors="replace"), str(path))


def median_or_none(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None
