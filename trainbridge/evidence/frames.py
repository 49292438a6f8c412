"""User source frames: parse stack traces, keep the program's own lines, make paths relative.

Inductor and FX keep Python stack traces as text (`node.meta["stack_trace"]`, kernel stack
traces, `# File: path:line in fn, code: ...` comments). `SourceFilter` decides which frames
belong to the user's program (files under `source_root`) and reports them relative to it.
Evidence imported from another machine names foreign absolute paths; those are matched by
their longest path suffix that exists under `source_root`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .bundle import SourceLoc

_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in ([^\n]+)\n(?:[ \t]*([^\n]*)\n?)?')
_FILE_COMMENT_RE = re.compile(r"#\s*File:\s*(.+?):(\d+) in ([\w<>.]+), code: ?(.*)$")
_LIBRARY_MARKERS = ("/site-packages/", "/dist-packages/", "/torch/", "<frozen", "<string>", "<eval_with_key")


class SourceFilter:
    """Which files are the program's, and their names relative to the program's folder."""

    def __init__(self, source_root: str | os.PathLike | None = None,
                 copies: list[str | os.PathLike] | tuple = ()):
        """`copies`: other folders holding the same program under the same relative paths
        (the harness runs a ported copy of the original; its lines equal the original's)."""
        self.root = Path(source_root).resolve() if source_root else None
        self.copies = [Path(c).resolve() for c in copies if c]
        self._cache: dict[str, str | None] = {}

    def rel(self, path: str) -> str | None:
        """The program-relative name of `path`, or None when it is not a program file."""
        if path in self._cache:
            return self._cache[path]
        out = self._rel(path)
        self._cache[path] = out
        return out

    def _rel(self, path: str) -> str | None:
        if not path or path.startswith("<"):
            return None
        if self.root is None:
            if any(m in path for m in _LIBRARY_MARKERS) or "/lib/python3" in path:
                return None
            return Path(path).name
        p = Path(path)
        for base in (self.root, *self.copies):
            try:
                return p.resolve().relative_to(base).as_posix()
            except (ValueError, OSError):
                pass
        if any(m in path for m in _LIBRARY_MARKERS):
            return None
        # foreign path (evidence from another machine): longest suffix present here
        parts = p.parts
        for i in range(1, len(parts)):
            cand = Path(*parts[i:])
            if (self.root / cand).is_file():
                return cand.as_posix()
        return None

    # ------------------------------------------------------------------ parsing ----
    def frames_from_trace(self, stack_trace: str | None) -> list[SourceLoc]:
        """User frames of a Python traceback string, outermost first."""
        out: list[SourceLoc] = []
        if not stack_trace:
            return out
        for m in _FRAME_RE.finditer(stack_trace):
            rel = self.rel(m.group(1))
            if rel is None:
                continue
            code = (m.group(4) or "").strip()
            if code and set(code) <= set("^~ "):
                code = ""
            out.append(SourceLoc(file=rel, line=int(m.group(2)), function=m.group(3).strip(), code=code))
        return out

    def frame_from_file_comment(self, line: str) -> SourceLoc | None:
        """`# File: /path/x.py:12 in forward, code: y = f(x)` (fx_graph_readable.py)."""
        m = _FILE_COMMENT_RE.search(line)
        if not m:
            return None
        rel = self.rel(m.group(1).strip())
        if rel is None:
            return None
        return SourceLoc(file=rel, line=int(m.group(2)), function=m.group(3), code=m.group(4).strip())

    def innermost_key(self, frame) -> str | None:
        """'file:line' of the innermost program frame of a live stack (cheap: no objects)."""
        f = frame
        while f is not None:
            rel = self.rel(f.f_code.co_filename)
            if rel is not None:
                return f"{rel}:{f.f_lineno}"
            f = f.f_back
        return None


_LINES_CACHE: dict[tuple[str, float], list[str]] = {}


def source_lines(root: str | os.PathLike | None, rel: str) -> list[str]:
    """All lines of a program file ([] when unavailable), cached by path and mtime."""
    if root is None:
        return []
    path = Path(root) / rel
    try:
        key = (str(path), path.stat().st_mtime)
    except OSError:
        return []
    if key not in _LINES_CACHE:
        try:
            _LINES_CACHE[key] = path.read_text(errors="replace").splitlines()
        except OSError:
            _LINES_CACHE[key] = []
    return _LINES_CACHE[key]


def read_line(root: str | os.PathLike | None, rel: str, line: int) -> str:
    """The text of one source line (stripped), '' when unavailable."""
    lines = source_lines(root, rel)
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""
