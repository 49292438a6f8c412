"""Search-and-replace edits, as a language model writes them, applied to a program's files.

Each edit names a file, a `search` text that must occur exactly once in that file (as the
earlier edits of the same answer left it) and its `replace` text. When the exact text is
absent, a whitespace-tolerant match is tried line by line (indentation, trailing blanks and
runs of spaces ignored); it is used only when it is unique, and the replacement is
re-indented by the difference between the search text's indentation and the file's. Every
changed Python file must still compile. Failures raise `EditError` with a message meant to
be shown to the model verbatim: it names the edit, the file and the first lines of the
search text, and where it can, the nearest line of the file.
"""

from __future__ import annotations

import difflib
import re

from pydantic import BaseModel, ConfigDict, Field

SHOW_LINES = 3  # lines of a failing search text quoted in an error


class Edit(BaseModel):
    model_config = ConfigDict(extra="ignore")

    file: str = Field(..., description="relative path of the file, as the prompt names it")
    search: str = Field(..., description="exact text to find; must occur exactly once in the file")
    replace: str = Field(..., description="text that replaces it")


class EditError(ValueError):
    """An edit that cannot be applied, or a result that does not compile."""


def _head(text: str, n: int = SHOW_LINES) -> str:
    lines = text.strip("\n").splitlines()
    shown = "\n".join(f"    | {ln}" for ln in lines[:n])
    more = f"\n    | ... ({len(lines) - n} more line(s))" if len(lines) > n else ""
    return shown + more


def _norm(line: str) -> str:
    return re.sub(r"\s+", " ", line.strip())


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _strip_blank_edges(lines: list[str]) -> list[str]:
    start, end = 0, len(lines)
    while start < end and not lines[start].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return lines[start:end]


def _reindent(replace: str, old_indent: str, new_indent: str) -> str:
    if old_indent == new_indent:
        return replace
    out = []
    for ln in replace.splitlines(keepends=True):
        if not ln.strip():
            out.append(ln)
        elif ln.startswith(old_indent):
            out.append(new_indent + ln[len(old_indent):])
        else:  # less indented than the search text: keep its offset from the file's indent
            out.append(new_indent + ln.lstrip(" \t"))
    return "".join(out)


def _tolerant_spans(text: str, search: str) -> list[tuple[int, int]]:
    """(first, last+1) line ranges of text whose normalised lines equal search's."""
    want = [_norm(s) for s in _strip_blank_edges(search.splitlines())]
    if not want:
        return []
    lines = [_norm(s) for s in text.splitlines()]
    n = len(want)
    return [(i, i + n) for i in range(len(lines) - n + 1) if lines[i:i + n] == want]


def _nearest(text: str, search: str) -> str:
    first = next((s for s in search.splitlines() if s.strip()), "")
    lines = text.splitlines()
    normed = [_norm(s) for s in lines]
    best = difflib.get_close_matches(_norm(first), normed, n=1, cutoff=0.6)
    if not best:
        return ""
    i = normed.index(best[0])
    return f"; the nearest line of the file is line {i + 1}: {lines[i].strip()!r}"


def apply_one(text: str, edit: Edit, label: str) -> str:
    """text with edit applied; EditError naming `label` otherwise."""
    if not edit.search.strip():
        raise EditError(f"{label} on {edit.file}: empty search text (quote the lines to replace)")
    count = text.count(edit.search)
    if count == 1:
        return text.replace(edit.search, edit.replace, 1)
    if count > 1:
        raise EditError(f"{label} on {edit.file}: search text occurs {count} times, it must be unique "
                        f"(include more surrounding lines):\n{_head(edit.search)}")
    spans = _tolerant_spans(text, edit.search)
    if len(spans) != 1:
        why = ("not found" if not spans
               else f"not found exactly, and matches {len(spans)} places when whitespace is ignored")
        near = _nearest(text, edit.search) if not spans else ""
        raise EditError(f"{label} on {edit.file}: search text {why}{near}; search began:\n{_head(edit.search)}")
    first, last = spans[0]
    lines = text.splitlines(keepends=True)
    search_lines = _strip_blank_edges(edit.search.splitlines())
    replace = _reindent(edit.replace, _indent(search_lines[0]), _indent(lines[first]))
    # the matched lines are whole lines: end the replacement with a newline if they did
    if lines[last - 1].endswith("\n") and replace and not replace.endswith("\n"):
        replace += "\n"
    return "".join(lines[:first]) + replace + "".join(lines[last:])


def apply_edits(files: dict[str, str], edits: list[Edit]) -> tuple[dict[str, str], list[str]]:
    """(all files with the edits applied, changed files in edit order). Raises EditError."""
    if not edits:
        raise EditError("the answer has no edits")
    out = dict(files)
    for i, edit in enumerate(edits, 1):
        label = f"edit {i} of {len(edits)}"
        if edit.file not in out:
            known = ", ".join(sorted(files)) or "none"
            raise EditError(f"{label}: file {edit.file!r} is not part of the program (files: {known})")
        out[edit.file] = apply_one(out[edit.file], edit, label)
    changed = [rel for rel in dict.fromkeys(e.file for e in edits) if out[rel] != files[rel]]
    if not changed:
        raise EditError("the edits change nothing (every replace equals its search)")
    for rel in changed:
        if rel.endswith(".py"):
            try:
                compile(out[rel], rel, "exec")
            except SyntaxError as e:
                where = f"line {e.lineno}" + (f": {e.text.strip()!r}" if e.text else "")
                raise EditError(f"after the edits {rel} does not compile: {e.msg} at {where}") from None
            except ValueError as e:  # e.g. a null byte
                raise EditError(f"after the edits {rel} does not compile: {e}") from None
    return out, changed
