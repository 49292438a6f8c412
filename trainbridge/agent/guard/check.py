"""The guard's entry point: every rule, for every file a candidate changed.

Files are checked before their contents: a changed file must be editable under the manifest
and not wholly protected; Python files must parse; then each file rule compares the facts of
the original with those of the candidate.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable

import libcst as cst

from ...workload import ProtectedRegion
from .call_checks import _rule_calls, _rule_imports, _rule_patching
from .collector import _facts
from .facts import _Facts
from .protected_checks import _rule_protected
from .rules import RULES, GuardVerdict, Violation
from .structure_checks import _rule_fallback, _rule_loss, _rule_structure

Finding = tuple[str, int, str]
FileRule = Callable[[_Facts, _Facts, list[ProtectedRegion], str], Iterable[Finding]]

# Run in this order for every changed Python file; each yields (rule id, line or node, message).
_FILE_RULES: list[FileRule] = [_rule_protected, _rule_calls, _rule_imports, _rule_patching, _rule_fallback,
                               _rule_loss, _rule_structure]


def check_candidate(original: dict[str, str], candidate: dict[str, str], protected: list[ProtectedRegion],
                    editable: list[str], target: str) -> GuardVerdict:
    """Every rule of RULES, for every file the candidate changed."""
    v: list[Violation] = []

    def add(rule: str, file: str, line: int, message: str):
        v.append(Violation(rule=rule, file=file, line=line, message=message, severity=RULES[rule].severity))

    for rel in sorted(set(original) | set(candidate)):
        before, after = original.get(rel), candidate.get(rel)
        if before == after:
            continue
        if before is None or after is None:
            add("not_editable", rel, 0, "file " + ("added" if before is None else "removed") +
                ": a candidate rewrites existing editable files only")
            continue
        if not any(fnmatch.fnmatch(rel, g) for g in editable):
            add("not_editable", rel, 0, "file is not editable under the manifest")
            continue
        regions = [p for p in protected if p.file == rel]
        if any(p.whole_file for p in regions):
            add("protected_file", rel, 0, "protected file edited (" + "; ".join(p.reason for p in regions if p.reason) + ")")
            continue
        if not rel.endswith(".py"):
            continue
        try:
            fb = _facts(before)
        except cst.ParserSyntaxError:
            continue  # the original itself does not parse: nothing to compare against
        try:
            fa = _facts(after)
        except cst.ParserSyntaxError as e:
            add("parse", rel, e.raw_line, str(e).splitlines()[0])
            continue
        for rule in _FILE_RULES:
            for r, line, msg in rule(fb, fa, regions, target):
                add(r, rel, fa.line_of(line), msg)
    return GuardVerdict(passed=not any(x.severity == "error" for x in v), violations=v)
