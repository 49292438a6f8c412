"""Append-only ledger file: every event flushed and fsync'd, so a crash loses nothing."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from .models import EVENT_ADAPTER, CandidateDecided, CandidateMeasured, CandidateProposed, CandidateValidated


class CandidateSummary(BaseModel):
    candidate_id: str
    pattern: str = "-"
    level: str = "-"
    source: str = "-"
    decision: str = "pending"
    stage: str | None = None
    reason: str = ""
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None


class Ledger:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, event: BaseModel) -> None:
        line = event.model_dump_json() + "\n"
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def events(self) -> Iterator:
        if not self.path.exists():
            return
        lines = self.path.read_text().splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                yield EVENT_ADAPTER.validate_json(line)
            except ValueError:
                if i == len(lines) - 1:
                    warnings.warn(f"{self.path}: skipping a truncated last line (the process died mid-write)")
                    return
                raise

    def candidates(self) -> list[CandidateSummary]:
        out: dict[str, CandidateSummary] = {}
        for e in self.events():
            cid = getattr(e, "candidate_id", None)
            if cid is None:
                continue
            s = out.setdefault(cid, CandidateSummary(candidate_id=cid))
            if isinstance(e, CandidateProposed):
                s.pattern, s.level, s.source = e.pattern, e.level, e.source
            elif isinstance(e, CandidateValidated) and not e.passed:
                s.stage, s.reason = e.stage, e.reason
            elif isinstance(e, CandidateMeasured):
                s.speedup = e.comparison.speedup
                s.ci_low, s.ci_high = e.comparison.ci_low, e.comparison.ci_high
            elif isinstance(e, CandidateDecided):
                s.decision, s.reason = e.decision, e.reason
        return list(out.values())
