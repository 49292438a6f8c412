"""A crashed run in one line that names the program's construct, not a bare traceback.

A person reading "the ported program does not run" needs the line of *their* program that
failed and what failed there. The child's error text is a Python traceback whose frames
name files in the program's folder (`.../programs/<digest>/train_gpt.py`); the deepest frame
in the program (not in torch or the harness) is the construct that stopped it. When that
frame is in one of the port's replacement files (`_tb_*.py`), the line of the program that
called the replacement leads, and the replacement's line follows it ("via").
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from ..targets.shims import SHIM_PREFIX

_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_PROGRAM_DIR = re.compile(r"/programs/[0-9a-f]{6,}/")


class CrashSite(BaseModel):
    """Where in the program a run failed, and with what."""

    file: str | None = None
    line: int | None = None
    function: str | None = None
    code: str | None = None
    exception: str = ""
    via: str | None = None  # the port's replacement (`_tb_*.py`) frame the program's line called into

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.file else "outside the program's own files"
        code = f" `{self.code[:120]}`" if self.code else ""
        via = f" via the port's replacement {self.via}" if self.via else ""
        return f"{where}{code} ({self.function or '?'}){via}: {self.exception}" if self.file else \
            f"{where}: {self.exception}"


def _exception_line(error: str) -> str:
    """The `Type: message` line of a traceback (the last line that looks like one)."""
    lines = [ln.strip() for ln in error.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b", ln) or \
                re.match(r"^[A-Za-z_][\w.]*: ", ln):
            return ln[:300]
    return (lines[0] if lines else "")[:300]


def crash_site(error: str | None, sources: dict[str, str] | None = None) -> CrashSite:
    """The deepest frame of the program's own files in `error`, with its source line.

    `sources` (relative path -> text) gives the line's code when the traceback does not
    show it; frames in torch, the standard library or the harness are skipped.
    """
    error = error or ""
    site = CrashSite(exception=_exception_line(error))
    own, shim = None, None
    for match in _FRAME.finditer(error):
        path = match["path"]
        cut = _PROGRAM_DIR.search(path)
        if not cut:
            continue
        rel = path[cut.end():]
        frame = (rel, int(match["line"]), match["func"])
        if rel.rsplit("/", 1)[-1].startswith(SHIM_PREFIX):
            shim = frame
        else:
            own, shim = frame, None
    if own is not None and shim is not None:
        shim_code = _code_at(shim[0], shim[1], error, sources)
        site.via = f"{shim[0]}:{shim[1]}" + (f" `{shim_code[:100]}`" if shim_code else "")
    frame = own or shim
    if frame is not None:
        site.file, site.line, site.function = frame
        site.code = _code_at(site.file, site.line, error, sources)
    return site


def _code_at(file: str, line: int, error: str, sources: dict[str, str] | None) -> str | None:
    """The source of file:line, from `sources` or from the traceback's own quote."""
    if sources and file in sources:
        lines = sources[file].splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else None
    for match in _FRAME.finditer(error):
        if match["path"].endswith("/" + file) and int(match["line"]) == line:
            rest = error[match.end():].splitlines()
            return rest[1].strip() if len(rest) > 1 else None
    return None
