"""The one catalog of torch_npu operators, optimizers and knobs that recipes and prompts may use.

Why one place: a fused-operator rewrite is only as right as the signature and caveats it was
written against (mask polarity, default scale, tuple returns, missing backward). Every fact
lives in npu_catalog.json with the document it came from; recipes look entries up by name,
the LLM prompt gets `render_for_prompt`, and the tests tie each operator entry to its CPU
reference in trainbridge.npu_reference (same parameter names as the documented signature).
Nothing here was run on an NPU: `verified_on_npu` stays False until a measurement says so.
"""

from __future__ import annotations

import ast
import json
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..patterns import Level, Pattern

CATALOG_PATH = Path(__file__).with_name("npu_catalog.json")
SCHEMA = "trainbridge.npu_catalog/1"

Kind = Literal["operator", "optimizer", "knob"]


class CatalogEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    kind: Kind
    api: str = Field(..., description="where it lives: torch_npu.npu_rms_norm, torch_npu.optim.X, env:VAR, ...")
    signature: str = Field(..., description="exact documented signature (operators/optimizers) or setting (knobs)")
    returns: str
    replaces: str = Field(..., description="the eager pattern (or default behaviour) it replaces")
    pattern: Pattern
    level: Level
    has_backward: bool
    dtypes: list[str] = Field(default_factory=list)
    constraints: list[str] = Field(default_factory=list, description="layout / shape / value limits")
    caveats: list[str] = Field(default_factory=list, description="what silently goes wrong if ignored")
    source: str = Field(..., description="which document each fact came from")
    verified_on_npu: bool = False
    reference: str | None = Field(None, description="name of the CPU reference in trainbridge.npu_reference")

    @model_validator(mode="after")
    def _consistent(self) -> "CatalogEntry":
        if self.kind in ("operator", "optimizer"):
            if not self.reference:
                raise ValueError(f"{self.name}: {self.kind} entries need a reference implementation")
            if not self.signature.startswith(self.api + "("):
                raise ValueError(f"{self.name}: signature must start with {self.api}(")
            if not self.dtypes:
                raise ValueError(f"{self.name}: {self.kind} entries list their dtypes")
        return self


class Param(BaseModel):
    """One parameter parsed from a documented signature string."""

    name: str
    keyword_only: bool = False
    default: str | None = Field(None, description="the default as written; None when required")


def _split_top(s: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return out


def parse_signature(signature: str) -> list[Param]:
    """Parameters of 'api(a, Tensor? b=None, *, out=(x, y)) -> T' (schema type prefixes dropped)."""
    start = signature.index("(")
    depth = 0
    for i in range(start, len(signature)):
        depth += signature[i] == "("
        depth -= signature[i] == ")"
        if depth == 0:
            break
    params, kw = [], False
    for item in _split_top(signature[start + 1:i]):
        item = item.strip()
        if item == "*":
            kw = True
            continue
        head, _, default = item.partition("=")
        name = head.split()[-1]
        params.append(Param(name=name, keyword_only=kw, default=default.strip() or None))
    return params


def literal_default(text: str | None):
    """The default as a Python value, or a marker object when it is notation (`required`, `(var, m, v)`)."""
    if text is None:
        return _REQUIRED
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return _NOTATION


_REQUIRED, _NOTATION = object(), object()


@lru_cache(maxsize=1)
def _load(path: str) -> tuple[CatalogEntry, ...]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    entries = tuple(CatalogEntry(**e) for e in data["entries"])
    names = [e.name for e in entries]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{path}: duplicate catalog names {dup}")
    return entries


def load_catalog() -> list[CatalogEntry]:
    """Every entry, in file order (entries are frozen; the list is a fresh copy)."""
    return list(_load(str(CATALOG_PATH)))


def entry(name: str) -> CatalogEntry:
    for e in _load(str(CATALOG_PATH)):
        if e.name == name:
            return e
    known = ", ".join(e.name for e in _load(str(CATALOG_PATH)))
    raise KeyError(f"no catalog entry {name!r}; known: {known}")


def for_pattern(pattern: Pattern) -> list[CatalogEntry]:
    return [e for e in _load(str(CATALOG_PATH)) if e.pattern == pattern]


def render_for_prompt(entries: list[CatalogEntry] | None = None) -> str:
    """Compact text for an LLM prompt: exact signatures, returns, constraints and every caveat."""
    entries = load_catalog() if entries is None else entries
    lines = ["torch_npu facts (from its documentation; none verified on an NPU unless marked [verified]).",
             "Use exactly these signatures; the caveats are where ports go wrong."]
    for e in entries:
        mark = " [verified]" if e.verified_on_npu else ""
        lines.append("")
        if e.kind == "knob":
            lines.append(f"* knob {e.name}{mark} ({e.level}): {e.signature}")
        else:
            bw = "has backward" if e.has_backward else "NO backward"
            lines.append(f"* {e.signature}{mark}")
            lines.append(f"  returns: {e.returns}; {bw}; dtypes: {', '.join(e.dtypes)}")
        lines.append(f"  replaces: {e.replaces}")
        for c in e.constraints:
            lines.append(f"  constraint: {c}")
        for c in e.caveats:
            lines.append(f"  CAVEAT: {c}")
    return "\n".join(lines)


__all__ = ["CatalogEntry", "Param", "CATALOG_PATH", "load_catalog", "entry", "for_pattern",
           "render_for_prompt", "parse_signature", "literal_default"]
