"""Ascend profile findings as optimization intents, next to the GPU's.

On the npu target the port's own profile is a second source of intents: a finding that names
a catalog entry has a pattern (`Finding.pattern`), and so the recipes that realise it. Each
such finding, ours or msprof-analyze's advisor's, becomes an intent for its pattern; the
planner ranks recipes by the best intent of their pattern, and the ledger's
`intent_id` / `intent_summary` say which profile finding a candidate answers, with its
operators, its source lines and who found it.
"""

from __future__ import annotations

from .models import AscendProfileReport, Finding

SEVERITY_CONFIDENCE = {"high": 0.9, "medium": 0.75, "low": 0.6, "info": 0.5}
PREFIX = "npu-profile"


def _summary(f: Finding) -> str:
    where = f" at {', '.join(f.source_lines)}" if f.source_lines else ""
    ops = f" (operators: {', '.join(f.ops[:6])})" if f.ops else ""
    return f"{f.source} on the npu profile, {f.rule}: {f.message}{ops}{where}"[:400]


def profile_intents(report: AscendProfileReport | dict | None) -> list[dict]:
    """The intents of every finding with a pattern (ours first, then the advisor's), in the
    shape the planner reads from the evidence bundle (id, pattern, confidence, summary)."""
    if report is None:
        return []
    r = report if isinstance(report, AscendProfileReport) else AscendProfileReport.model_validate(report)
    found = list(r.findings) + (list(r.advisor.findings) if r.advisor else [])
    out = []
    for i, f in enumerate(x for x in found if x.pattern):
        out.append({"id": f"{PREFIX}-{i + 1:02d}:{f.rule}", "pattern": f.pattern,
                    "confidence": SEVERITY_CONFIDENCE.get(f.severity, 0.5), "summary": _summary(f),
                    "source": f.source, "ops": list(f.ops), "source_lines": list(f.source_lines)})
    return out
