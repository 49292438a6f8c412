"""The append-only ledger file: each event one line, flushed and fsync'd before append returns.

A crash can then lose at most the line being written: reading skips such a torn last line
with a warning, and the next append cuts it off before writing, so a torn line is only ever
the last one. Any other damaged line (an edit, a disk error) is an error naming the line, never
a silent drop (`salvage=True` skips it with a warning instead). A complete line that no longer
matches the models is an error too: a schema problem, not a crash. Fields this version does not
know (a newer TrainBridge wrote them) are ignored with a warning; a newer ledger schema version
is refused with a clear message.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from pydantic import ValidationError

from .models import (
    EVENT_TYPES,
    LEDGER_SCHEMA_VERSION,
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
    """A ledger line that cannot be read as an event (damaged, invalid, or from a newer schema);
    names file and line."""


def _drop(data, loc: tuple) -> None:
    """Remove the field at pydantic error location `loc` from `data`; a part of `loc` that is not a
    key or index (the tag of a tagged union) is stepped over."""
    cur = data
    for part in loc[:-1]:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, int) and part < len(cur):
            cur = cur[part]
    if isinstance(cur, dict):
        cur.pop(loc[-1], None)


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
    predicted_saving_pct: float | None = None  # the hypothesis' (calibrated) prediction, % of the port's step
    measured_saving_pct: float | None = None   # % of the incumbent's step
    prediction_far: bool | None = None         # the prediction lies far outside the measured interval

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

    def __init__(self, path: str | Path, *, salvage: bool = False):
        self.path = Path(path)
        self.salvage = salvage
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, event: BaseModel) -> None:
        if not isinstance(event, EVENT_TYPES):
            raise TypeError(f"not a ledger event: {type(event).__name__}")
        data = (event.model_dump_json() + "\n").encode()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self._cut_torn_tail(fd)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _cut_torn_tail(self, fd: int) -> None:
        """A crash mid-write left half a line at the end: cut it off (it was never readable), so
        a torn line is always the last one and any damaged line before it is real damage."""
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return
        keep, end = 0, size
        while end > 0:  # back to the last newline, a chunk at a time
            start = max(0, end - (1 << 16))
            chunk = os.pread(fd, end - start, start)
            if b"\n" in chunk:
                keep = start + chunk.rfind(b"\n") + 1
                break
            end = start
        warnings.warn(f"{self.path}: cutting a torn last line ({size - keep} bytes, the process died mid-write)",
                      stacklevel=3)
        os.ftruncate(fd, keep)
        os.fsync(fd)

    def events(self) -> list[BaseModel]:
        """Every event in file order; a torn last line skipped with a warning, any other damaged
        line an error (or, with `salvage`, skipped with a warning)."""
        if not self.path.exists():
            return []
        out = []
        lines = self.path.read_bytes().splitlines()
        last = max((i for i, ln in enumerate(lines, start=1) if ln.strip()), default=0)
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except ValueError:
                if n == last:
                    warnings.warn(f"{self.path}:{n}: skipping a truncated line (the process died mid-write)",
                                  stacklevel=2)
                    continue
                if self.salvage:
                    warnings.warn(f"{self.path}:{n}: skipping a damaged line (salvage)", stacklevel=2)
                    continue
                raise LedgerError(f"{self.path}:{n}: a damaged line (not JSON) before the end of the ledger; "
                                  "its events would be lost without a word (`trainbridge ledger --salvage` reads "
                                  "around it)") from None
            out.append(self._event(data, line, n))
        return out

    def _event(self, data, line: bytes, n: int) -> BaseModel:
        version = data.get("ledger_schema_version") if isinstance(data, dict) else None
        if isinstance(version, int) and version > LEDGER_SCHEMA_VERSION:
            raise LedgerError(f"{self.path}:{n}: written with ledger schema {version}; this TrainBridge reads up to "
                              f"{LEDGER_SCHEMA_VERSION}: upgrade it to read this run")
        try:
            return parse_event(line)
        except ValidationError as e:
            unknown = [err["loc"] for err in e.errors() if err["type"] == "extra_forbidden"]
            if not unknown or len(unknown) != len(e.errors()):
                raise LedgerError(f"{self.path}:{n}: not a valid ledger event: {e}") from e
        for loc in unknown:  # a newer TrainBridge's fields: read the event without them
            _drop(data, loc)
        warnings.warn(f"{self.path}:{n}: ignoring fields this version does not know: "
                      f"{', '.join('.'.join(map(str, loc)) for loc in unknown)}", stacklevel=3)
        try:
            return parse_event(json.dumps(data))
        except ValidationError as e:
            raise LedgerError(f"{self.path}:{n}: not a valid ledger event: {e}") from e

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
                s.predicted_saving_pct = e.hypothesis.predicted_saving_pct
            elif isinstance(e, CandidateValidated):
                s.stage, s.validated = e.stage, e.passed
                if not e.passed:
                    s.reason = e.reason
            elif isinstance(e, CandidateMeasured):
                c = e.comparison
                s.speedup, s.ci_low, s.ci_high, s.suspicious = c.speedup, c.ci_low, c.ci_high, c.suspicious
                if e.prediction is not None:
                    s.measured_saving_pct, s.prediction_far = e.prediction.measured_pct, e.prediction.far
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
