"""A crashed run in one line that names the program's construct, not a bare traceback.

A person reading "the ported program does not run" needs the line of *their* program that
failed and what failed there. The child's error text is a Python traceback whose frames
name files in the program's folder (`.../programs/<digest>/train_gpt.py`); the deepest frame
in the program (not in torch or the harness) is the construct that stopped it.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_PROGRAM_DIR = re.compile(r"/programs/[0-9a-f]{6,}/")


class CrashSite(BaseModel):
    """Where in the program a run failed, and with what."""

    file: str | None = None
    line: int | None = None
    function: str | None = None
    code: str | None = None
    exception: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.file else "outside the program's own files"
        code = f" `{self.code[:120]}`" if self.code else ""
        return f"{where}{code} ({self.function or '?'}): {self.exception}" if self.file else \
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
    for match in _FRAME.finditer(error):
        path = match["path"]
        cut = _PROGRAM_DIR.search(path)
        if not cut:
            continue
        rel = path[cut.end():]
        site.file, site.line, site.function = rel, int(match["line"]), match["func"]
    if site.file and sources and site.file in sources:
        lines = sources[site.file].splitlines()
        if 0 < site.line <= len(lines):
            site.code = lines[site.line - 1].strip()
    elif site.file:
        # the traceback prints the line right after its frame header
        for match in _FRAME.finditer(error):
            if match["path"].endswith("/" + site.file) and int(match["line"]) == site.line:
                rest = error[match.end():].splitlines()
                site.code = rest[1].strip() if len(rest) > 1 else None
    return site
