"""The run ledger's events: one JSON object per line of `runs/<id>/ledger.jsonl`.

The JSON a person reviews is exactly these models (`ledger_schema()` publishes them).
Raw samples are kept in the events so a decision can be re-derived from the ledger alone.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field, TypeAdapter

from ..measure.statistics import AACalibration, Comparison

Scalar = Union[str, float, int, bool, None]


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class _Event(BaseModel):
    run_id: str
    time_utc: str


class RunStarted(_Event):
    event: Literal["run_started"] = "run_started"
    workload: str
    target: str
    agent: str
    budget_candidates: int
    budget_minutes: float
    argv: list[str]
    environment: dict[str, str]


class RunResumed(_Event):
    event: Literal["run_resumed"] = "run_resumed"
    argv: list[str]


class PortApplied(_Event):
    event: Literal["port_applied"] = "port_applied"
    target: str
    changes: list[dict[str, Scalar]] = Field(..., description="PortChange: file, line, kind, before, after, semantic_change, note")
    diff: str


class BaselineMeasured(_Event):
    event: Literal["baseline_measured"] = "baseline_measured"
    runs_ms: list[list[float]] = Field(..., description="measured step_ms of each baseline process run")
    losses: list[float | None]
    flops_per_step: int | None
    work_items_per_step: list[int]
    ops_per_step: int | None
    median_ms: float
    verdict: str
    profile_path: str
    aa: AACalibration = Field(..., description="A/A calibration of the acceptance rule on these runs")
    environment: dict[str, Scalar | dict[str, str]] = Field(default_factory=dict)


class EvidenceLoaded(_Event):
    event: Literal["evidence_loaded"] = "evidence_loaded"
    path: str | None
    intents: int
    note: str


class CandidateProposed(_Event):
    event: Literal["candidate_proposed"] = "candidate_proposed"
    candidate_id: str
    intent_id: str | None
    pattern: str
    level: str
    gap_class: str
    source: str = Field(..., description="recipe:<name> or llm:<model>")
    mechanism: str
    hypothesis: dict[str, Scalar | list[str]] = Field(..., description="ops_removed, predicted_saving_ms/pct, reject_if")
    diff: str
    files: list[str]
    incumbent: str
    llm: list[dict[str, Scalar]] = Field(default_factory=list, description="LLM requests/answers (tokens, latency)")


class CandidateValidated(_Event):
    event: Literal["candidate_validated"] = "candidate_validated"
    candidate_id: str
    passed: bool
    stage: str = Field(..., description="apply | parse | guard | import | correctness | work | lab")
    reason: str
    details: dict[str, Scalar] = Field(default_factory=dict)


class CandidateMeasured(_Event):
    event: Literal["candidate_measured"] = "candidate_measured"
    candidate_id: str
    incumbent_runs_ms: list[list[float]]
    candidate_runs_ms: list[list[float]]
    comparison: Comparison
    note: str = ""
    problems: list[str] = Field(default_factory=list)


class CandidateDecided(_Event):
    event: Literal["candidate_decided"] = "candidate_decided"
    candidate_id: str
    decision: Literal["accepted", "rejected"]
    reason: str
    incumbent_speedup_vs_baseline: float | None = Field(None, description="chained estimate; the end-to-end figure is measured at the end")


class RunFinished(_Event):
    event: Literal["run_finished"] = "run_finished"
    final_speedup: float | None
    final_ci: list[float | None] | None
    compiled_port_speedup: float | None
    final_vs_compiled: float | None
    accepted: list[str]
    rejected: list[str]
    done_reason: str
    report_path: str
    end_to_end: dict = Field(default_factory=dict, description="raw runs per arm and their comparisons")


class VerifyResult(_Event):
    event: Literal["verify_result"] = "verify_result"
    recorded_speedup: float | None
    measured_speedup: float
    ci: list[float]
    holds: bool
    port_runs_ms: list[list[float]]
    final_runs_ms: list[list[float]]


LedgerEvent = Annotated[
    Union[RunStarted, RunResumed, PortApplied, BaselineMeasured, EvidenceLoaded, CandidateProposed,
          CandidateValidated, CandidateMeasured, CandidateDecided, RunFinished, VerifyResult],
    Field(discriminator="event"),
]
EVENT_ADAPTER: TypeAdapter = TypeAdapter(LedgerEvent)


def ledger_schema() -> dict:
    return EVENT_ADAPTER.json_schema()
