"""What the rewriter reads from the loop's context dict, in the shapes the loop may pass.

The context carries the manifest's protected regions and editable globs (directly, through
the manifest, or through the workload) and the GPU intent with its source spans (as dicts,
models or `file:first-last` strings). Both the prompt and the guard check on a candidate need
these, so they are read here once, the same way for both.
"""

from __future__ import annotations

import re

from pydantic import BaseModel


def guard_spec(context: dict):
    """(protected regions, editable globs) when the context carries them (workload, manifest or lists)."""
    wl = context.get("workload")
    manifest = context.get("manifest") or getattr(wl, "manifest", None)
    protected = context.get("protected", getattr(manifest, "protected", None))
    editable = context.get("editable", getattr(manifest, "editable", None))
    if protected is None and editable is None:
        return None
    return list(protected or []), list(editable or ["*"])


def intent_spans(context: dict) -> list[tuple[str | None, int, int]]:
    """(file, first, last) lines from context['intent']['spans'] / 'lines', in a few accepted shapes."""
    intent = context.get("intent")
    if isinstance(intent, BaseModel):
        intent = intent.model_dump()
    raw = (intent or {}).get("spans") or (intent or {}).get("source_spans") or [] if isinstance(intent, dict) else []
    out = []
    for s in raw:
        if isinstance(s, BaseModel):
            s = s.model_dump()
        if isinstance(s, dict):
            # the evidence bundle's SourceSpan names them start_line / end_line
            a = s.get("start_line", s.get("line_start", s.get("start", s.get("line"))))
            b = s.get("end_line", s.get("line_end", s.get("end", a)))
            if isinstance(a, int):
                out.append((s.get("file"), a, b if isinstance(b, int) else a))
        elif isinstance(s, str):
            m = re.match(r"(.+?):(\d+)(?:-(\d+))?$", s)
            if m:
                out.append((m.group(1), int(m.group(2)), int(m.group(3) or m.group(2))))
    return out
