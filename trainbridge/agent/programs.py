"""A program on disk (one folder per program, its file list in files.json) and diffs between two."""

from __future__ import annotations

import difflib
import json
from pathlib import Path


def write_program(dest: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (dest / "files.json").write_text(json.dumps(sorted(files)))


def read_program(src: Path) -> dict[str, str]:
    names = json.loads((src / "files.json").read_text())
    return {rel: (src / rel).read_text() for rel in names}


def unified_diff(before: dict[str, str], after: dict[str, str], a: str = "a", b: str = "b") -> str:
    out = []
    for rel in sorted(set(before) | set(after)):
        x, y = before.get(rel, ""), after.get(rel, "")
        if x != y:
            out.extend(difflib.unified_diff(x.splitlines(True), y.splitlines(True), f"{a}/{rel}", f"{b}/{rel}"))
    return "".join(out)
