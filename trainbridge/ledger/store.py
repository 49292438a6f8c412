"""The append-only ledger file: each event one line, flushed and fsync'd before append returns.

A crash can then lose at most the line being written; reading skips such a truncated line
with a warning (and the next append starts on a fresh line), while a complete line that no
longer matches the models is an error: that is a schema problem, not a crash.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from .models import (
    EVENT_TYPES,
    BaselineMeasured,
    CandidateDecided,
    CandidateMeasured,
    CandidateProposed,
    CandidateValidated,
    RunFinished,
    RunResumed,
    RunStarted,
    VerifyResult,
    parse_event,
)


class LedgerError(ValueError):
    """A ledger line that is complete JSON but not a valid event; names file and line."""


class CandidateSummary(BaseModel):
    """Everything the ledger says about one candidate, folded from its events."""

    candidate_id: str
    intent_id: str | None = None
    pattern: str = "-"
    level: str = "-"
    source: str = "-"
    mechanism: str = ""
    decision: Literal["accepted", "rejected", "validated_not_measured", "pending"] = "pending"
    stage: str | None = None  # last validation stage recorded
    validated: bool | None = None
    reason: str = ""
    rule: str | None = None  # the acceptance rule that decided (measure.acceptance.Rule)
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    suspicious: bool = False
    incumbent_speedup_vs_baseline: float | None = None

    @property
    def ci(self) -> tuple[float, float] | None:
        return None if self.ci_low is None or self.ci_high is None else (self.ci_low, self.ci_high)


class LedgerState(BaseModel):
    """Where a run stands according to its ledger."""

    run_id: str | None = None
    workload: str | None = None
    target: str | None = None
    n_events: int = 0
    last_event: str | None = None
    resumed: int = 0
    baseline_median_ms: float | None = None
    accepted: list[str] = Field(default_factory=list)
    rejected: list[str] = Field(default_factory=list)
    pending: list[str] = Field(default_factory=list)
    validated_not_measured: list[str] = Field(default_factory=list, description="dry-run candidates awaiting an NPU")
    incumbent_id: str = "port"
    incumbent_speedup_vs_baseline: float = 1.0
    finished: bool = False
    final_speedup: float | None = None
    final_ci: tuple[float, float] | None = None
    verified: bool | None = None  # holds of the last VerifyResult


class Ledger:
    """`runs/<id>/ledger.jsonl`; several Ledger objects on one path may append in turn."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, event: BaseModel) -> None:
        if not isinstance(event, EVENT_TYPES):
            raise TypeError(f"not a ledger event: {type(event).__name__}")
        data = (event.model_dump_json() + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if self._ends_mid_line():
                data = b"\n" + data  # a crash left half a line: do not glue this event onto it
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _ends_mid_line(self) -> bool:
        size = self.path.stat().st_size
        if size == 0:
            return False
        with open(self.path, "rb") as f:
            f.seek(size - 1)
            return f.read(1) != b"\n"

    def events(self) -> list[BaseModel]:
        """Every event in file order; truncated (non-JSON) lines skipped with a warning."""
        if not self.path.exists():
            return []
        out = []
        for n, line in enumerate(self.path.read_bytes().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                json.loads(line)
            except ValueError:
                warnings.warn(f"{self.path}:{n}: skipping a truncated line (the process died mid-write)",
                              stacklevel=2)
                continue
            try:
                out.append(parse_event(line))
            except ValueError as e:
                raise LedgerError(f"{self.path}:{n}: not a valid ledger event: {e}") from e
        return out

    def candidates(self) -> list[CandidateSummary]:
        """One summary per candidate, in order of first appearance; later events win."""
        out: dict[str, CandidateSummary] = {}
        for e in self.events():
            cid = getattr(e, "candidate_id", None)
            if cid is None:
                continue
            s = out.setdefault(cid, CandidateSummary(candidate_id=cid))
            if isinstance(e, CandidateProposed):
                s.intent_id, s.pattern, s.level = e.intent_id, e.pattern, e.level
                s.source, s.mechanism = e.source, e.mechanism
            elif isinstance(e, CandidateValidated):
                s.stage, s.validated = e.stage, e.passed
                if not e.passed:
                    s.reason = e.reason
            elif isinstance(e, CandidateMeasured):
                c = e.comparison
                s.speedup, s.ci_low, s.ci_high, s.suspicious = c.speedup, c.ci_low, c.ci_high, c.suspicious
            elif isinstance(e, CandidateDecided):
                s.decision, s.reason, s.rule = e.decision, e.reason, e.rule
                s.incumbent_speedup_vs_baseline = e.incumbent_speedup_vs_baseline
        return list(out.values())

    def final_state(self) -> LedgerState:
        """The run's standing: incumbent, decisions, final figure, last verification."""
        events = self.events()
        st = LedgerState(n_events=len(events), last_event=events[-1].event if events else None)
        for e in events:
            st.run_id = st.run_id or e.run_id
            if isinstance(e, RunStarted):
                st.workload, st.target = e.workload, e.target
            elif isinstance(e, RunResumed):
                st.resumed += 1
            elif isinstance(e, BaselineMeasured):
                st.baseline_median_ms = e.median_ms if e.median_ms is not None else (
                    e.summary.median_ms if e.summary else None)
            elif isinstance(e, RunFinished):
                st.finished, st.final_speedup, st.final_ci = True, e.final_speedup, e.final_ci
            elif isinstance(e, VerifyResult):
                st.verified = e.holds
            elif isinstance(e, CandidateDecided) and e.decision in ("accepted", "validated_not_measured"):
                # decision order, not proposal order, makes the incumbent
                st.incumbent_id = e.candidate_id
                if e.incumbent_speedup_vs_baseline is not None:
                    st.incumbent_speedup_vs_baseline = e.incumbent_speedup_vs_baseline
        for c in self.candidates():
            {"accepted": st.accepted, "rejected": st.rejected, "pending": st.pending,
             "validated_not_measured": st.validated_not_measured}[c.decision].append(c.candidate_id)
        return st
