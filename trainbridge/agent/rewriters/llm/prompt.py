"""The prompt templates and the text parts that fill them.

The wording of the prompts lives in trainbridge/prompts/*.md (system, rewrite, repair; the
repository's top-level `prompts/` links there), outside the code, so it can be edited and
reviewed as text. It is package data: an installed wheel carries it. `TRAINBRIDGE_PROMPTS`
points at another folder.
This module finds and fills those templates, and renders the parts of the context that go
into them as text: the target profile, the GPU intent and its evidence, and the manifest's
protected regions.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path
from typing import Any

from pydantic import BaseModel

PROMPTS_ENV = "TRAINBRIDGE_PROMPTS"


def prompts_dir() -> Path:
    """$TRAINBRIDGE_PROMPTS, else the package's prompts/ (the first prompts/ above this file), else ./prompts."""
    env = os.environ.get(PROMPTS_ENV)
    if env:
        p = Path(env).expanduser()
        if not p.is_dir():
            raise FileNotFoundError(f"{PROMPTS_ENV}={env}: not a directory")
        return p
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / "prompts"
        if (cand / "system.md").is_file():
            return cand
    cand = Path.cwd() / "prompts"
    if (cand / "system.md").is_file():
        return cand
    raise FileNotFoundError(f"no prompts/ folder with system.md above {here} or in {Path.cwd()}; set {PROMPTS_ENV}")


def load_prompt(name: str) -> str:
    """The text of prompts/<name> (".md" may be left off)."""
    d = prompts_dir()
    path = d / name
    if not path.is_file() and not name.endswith(".md"):
        path = d / f"{name}.md"
    if not path.is_file():
        raise FileNotFoundError(f"prompt {name!r} not found in {d}")
    return path.read_text()


def render_prompt(name: str, **values: Any) -> str:
    """prompts/<name> with its $placeholders filled (string.Template; a missing value is an error)."""
    return string.Template(load_prompt(name)).substitute({k: str(v) for k, v in values.items()})


# ----------------------------------------------------------- context parts ----

def profile_summary(profile, top: int = 10) -> str:
    if profile is None:
        return "(no profile given)"
    if isinstance(profile, dict):
        try:
            from ....profile.analysis import ProfileReport

            profile = ProfileReport.model_validate(profile)
        except Exception:
            return json.dumps(profile)[:2000]
    p = profile
    s = p.step
    lines = [
        f"- step: median {s.median_ms:.2f} ms (p10 {s.p10_ms:.2f}, p90 {s.p90_ms:.2f}, n={s.n})",
        f"- verdict: {p.verdict}; operator self time {p.op_self_ms_per_step:.2f} ms/step, outside operators "
        f"{p.outside_ops_ms_per_step:.2f} ms/step ({100 * p.outside_ops_share:.0f} %)",
        f"- shares of operator time: GEMM {100 * p.gemm_share:.0f} %, elementwise/reduction "
        f"{100 * p.elementwise_share:.0f} %, communication {100 * p.communication_share:.0f} %",
    ]
    if p.ops_per_step:
        lines.append(f"- {p.ops_per_step} operators per step ({p.distinct_ops or '?'} distinct)")
    if p.top_ops:
        lines.append("- top operators (self ms/step, calls/step, share):")
        lines += [f"    {o.name:<44} {o.self_ms_per_step:8.3f} {o.calls_per_step:8.1f} {100 * o.share:5.1f} %"
                  for o in p.top_ops[:top]]
    lines += [f"- {e}" for e in (p.evidence or [])[:5]]
    return "\n".join(lines)


def intent_text(item, context: dict) -> str:
    head = f"{item.intent_id or '(no GPU intent)'}: {item.intent_summary or 'no summary'}"
    intent = context.get("intent")
    if isinstance(intent, BaseModel):
        intent = intent.model_dump()
    if isinstance(intent, dict):
        keep = {k: v for k, v in intent.items() if k not in ("id", "summary") and v not in (None, "", [], {})}
        if keep:
            head += "\nGPU evidence:\n" + json.dumps(keep, indent=1, default=str)[:4000]
    elif not item.intent_id:
        head += "\n(no GPU evidence for this item: it was planned from the target profile only)"
    return head


def protected_text(spec) -> str:
    if spec is None:
        return "(the manifest's protected regions are enforced by the harness; see the rules)"
    protected, editable = spec
    lines = [f"- editable files: {', '.join(editable)}"]
    for r in protected:
        what = ["the whole file"] if getattr(r, "whole_file", False) else []
        if getattr(r, "symbols", None):
            what.append("symbols " + ", ".join(r.symbols))
        if getattr(r, "names", None):
            what.append("assignments to " + ", ".join(r.names))
        lines.append(f"- {r.file}: {'; '.join(what) or '(nothing)'}" + (f" ({r.reason})" if r.reason else ""))
    return "\n".join(lines)
