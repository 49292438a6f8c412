"""The run ledger's events: one JSON object per line of `runs/<id>/ledger.jsonl`.

The JSON a person reviews is exactly these models (`ledger_schema()` publishes them), a
union discriminated by `event`. Raw samples (every run's step_ms) are kept in the events,
so any decision can be re-derived, and re-verified, from the ledger alone. Unknown fields
are refused: a field a writer adds without adding it here would otherwise vanish silently.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

from ..harness.models import Environment, TargetName
from ..measure.prediction import PredictionCheck
from ..measure.statistics import AACalibration, Comparison, Summary, summarize
from ..profile.floor import FloorSummary

LEDGER_SCHEMA_VERSION = 1
Scalar = Union[str, float, int, bool, None]
ValidationStage = Literal["apply", "parse", "import", "clock", "guard", "correctness", "work", "mechanism", "lab"]


def utc_now() -> str:
    """ISO 8601 time in UTC with the offset written out, the format of every `time_utc`."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Event(_Strict):
    run_id: str
    time_utc: str = Field(..., description="ISO 8601 with UTC offset, from utc_now()")

    @field_validator("time_utc")
    @classmethod
    def _iso_utc(cls, v: str) -> str:
        t = dt.datetime.fromisoformat(v)
        if t.utcoffset() is None:
            raise ValueError(f"time_utc {v!r} has no UTC offset")
        return v


# ------------------------------------------------------------- sub-records ----
class PortChangeRecord(_Strict):
    """One edit of the naive port (targets.port_source.PortChange as recorded)."""

    file: str
    line: int
    kind: str
    before: str
    after: str
    semantic_change: bool = Field(False, description="the port changed what the program computes (e.g. precision)")
    note: str = ""


class HypothesisRecord(_Strict):
    """What a candidate claims before it is measured, so the claim can be checked after."""

    ops_removed: list[str] = Field(default_factory=list)
    compiled_region: bool = Field(False, description="a torch.compile region: a compiled graph must be entered "
                                                     "inside the training step")
    gemm_precision: Literal["lower", "higher"] | None = Field(
        None, description="a precision change: more ('lower') or fewer ('higher') GEMM/convolution ops in 16-bit")
    predicted_saving_ms: float = Field(..., description="calibrated by what the recipe realised when measured "
                                                        "(measure.prediction); older ledgers: uncalibrated")
    predicted_saving_pct: float
    uncalibrated_saving_ms: float | None = Field(None, description="the profile's prediction before calibration")
    calibration: str = Field("", description="the factor applied and the measurements it comes from")
    reject_if: str


class EndToEnd(_Strict):
    """Final program vs port (and torch.compile of the port) in one interleaved session."""

    runs_ms: dict[str, list[list[float]]] = Field(default_factory=dict, description="arm -> step_ms per run")
    final_vs_port: Comparison | None = None
    final_vs_compiled_port: Comparison | None = None
    compiled_port_vs_port: Comparison | None = None
    min_effect: float | None = Field(None, description="the bar final_vs_port was judged at: the run's (A/A-raised) one")
    compiled_port_raw_saving_ms: float | None = Field(
        None, description="the planner's uncalibrated compile_model prediction for the port, from the run's profile: "
                          "beside compiled_port_vs_port, one measurement of what compiling the whole model realises")
    problems: list[str] = Field(default_factory=list, description="rounds dropped and measured again: a run "
                                                                  "failed, or the round was outlier-contaminated")
    outlier_rule: str | None = Field(None, description="the rule that drops an outlier-contaminated round; "
                                                       "absent in older ledgers")
    note: str = Field("", description="e.g. why nothing was measured (dry run)")


# ------------------------------------------------------------------ events ----
class RunStarted(_Event):
    event: Literal["run_started"] = "run_started"
    ledger_schema_version: int = LEDGER_SCHEMA_VERSION
    workload: str = Field(..., description="workload folder as given")
    workload_name: str | None = Field(None, description="manifest name")
    target: TargetName
    agent: str
    budget_candidates: int
    budget_minutes: float
    argv: list[str]
    environment: dict[str, str] = Field(default_factory=dict)


class RunResumed(_Event):
    event: Literal["run_resumed"] = "run_resumed"
    argv: list[str]


class PortApplied(_Event):
    event: Literal["port_applied"] = "port_applied"
    target: TargetName | None = None
    changes: list[PortChangeRecord]
    diff: str = ""
    blockers: list[str] = Field(default_factory=list, description="constructs the port could not make run "
                                                                   "(the run stops here when there are any)")


class BaselineMeasured(_Event):
    event: Literal["baseline_measured"] = "baseline_measured"
    runs_ms: list[list[float]] = Field(..., description="measured step_ms of each baseline process run")
    losses: list[float | None]
    flops_per_step: int | None
    work_items_per_step: list[int]
    ops_per_step: int | None = None
    median_ms: float | None = None
    verdict: str | None = Field(None, description="profile bottleneck verdict")
    profile_path: str | None = None
    floor: FloorSummary | None = Field(None, description="the port's step against its floor on this machine")
    aa: AACalibration | None = Field(None, description="A/A calibration of the acceptance rule on these runs")
    min_effect: float | None = Field(None, description="the minimum effect the run's decisions use: the configured "
                                                       "one, or more when the A/A check found the runs noisier")
    summary: Summary | None = Field(None, description="of the pooled runs; filled in when not given")
    environment: Environment | None = None
    notes: list[str] = Field(default_factory=list, description="what the manifest says and the baseline did not "
                                                              "(e.g. [work] per_step against the counted work)")

    @field_validator("environment", mode="before")
    @classmethod
    def _empty_env(cls, v):
        return None if v == {} else v

    @model_validator(mode="after")
    def _fill_summary(self) -> BaselineMeasured:
        pooled = [x for r in self.runs_ms for x in r]
        if self.summary is None and pooled:
            self.summary = summarize(pooled)
        return self


EvidenceSource = Literal["file", "collected", "skipped"]


class EvidenceLoaded(_Event):
    """Where the run's GPU evidence came from, and whether the run has any.

    `required` is true when the user asked for evidence (collect, or `--evidence`) and did not
    pass `--allow-no-evidence`: a run without intents then says so in its summary and report
    and exits non-zero, instead of planning from the target profile alone in silence.
    """

    event: Literal["evidence_loaded"] = "evidence_loaded"
    path: str | None
    intents: int
    note: str = ""
    source: EvidenceSource | None = Field(None, description="given file, collected now, or skipped (--skip-collect)")
    error: str | None = Field(None, description="why the evidence could not be loaded or collected")
    required: bool = Field(False, description="the run was asked for GPU evidence and may not go on quietly without")

    @property
    def missing(self) -> str | None:
        """Why a run that was asked for evidence has none to plan with; None when it has some
        (or was told it may go without)."""
        if not self.required or self.intents > 0:
            return None
        what = "collected" if self.source == "collected" else "given"
        return self.error or f"the {what} evidence bundle has no optimization intents"


class CandidateProposed(_Event):
    event: Literal["candidate_proposed"] = "candidate_proposed"
    candidate_id: str
    intent_id: str | None = None
    intent_summary: str = Field("", description="what the intent says: the GPU evidence's summary, or the npu profile "
                                                "finding (rule, operators, source lines, who found it)")
    pattern: str
    level: str
    gap_class: str
    source: str = Field(..., description="'recipe:<name>' or 'llm:<model>'")
    mechanism: str
    hypothesis: HypothesisRecord
    diff: str
    files: list[str]
    incumbent: str = Field("port", description="candidate id the diff applies to")
    llm: list[dict[str, Scalar | list[dict[str, str]]]] = Field(
        default_factory=list, description="LLM requests and answers for this candidate (tokens, latency, cost; never the key)")


class CandidateValidated(_Event):
    event: Literal["candidate_validated"] = "candidate_validated"
    candidate_id: str
    passed: bool
    stage: ValidationStage = Field(..., description="last stage reached; the failing one when passed is false")
    reason: str
    details: dict[str, Scalar] = Field(default_factory=dict)


class CandidateMeasured(_Event):
    event: Literal["candidate_measured"] = "candidate_measured"
    candidate_id: str
    incumbent_runs_ms: list[list[float]] = Field(..., description="raw step_ms of each incumbent process run")
    candidate_runs_ms: list[list[float]]
    comparison: Comparison
    note: str = ""
    aa_note: str = Field("", description="what the A/A calibration says about this decision's noise floor")
    problems: list[str] = Field(default_factory=list, description="timing rounds dropped and measured again: a "
                                                                  "failed run, or a ratio outlier-contaminated")
    outlier_rule: str | None = Field(None, description="the rule that drops an outlier-contaminated round "
                                                       "(measure.outliers.OUTLIER_RULE); absent in older ledgers")
    prediction: PredictionCheck | None = Field(None, description="the hypothesis' predicted saving beside the "
                                                                 "measured one; `far` flags a miss past the interval")


class CandidateDecided(_Event):
    event: Literal["candidate_decided"] = "candidate_decided"
    candidate_id: str
    decision: Literal["accepted", "rejected", "validated_not_measured"] = Field(
        ..., description="validated_not_measured: a dry run (npu references on the CPU); never a speedup")
    reason: str
    incumbent_speedup_vs_baseline: float | None = Field(
        None, description="chained estimate; the end-to-end figure is measured at the end")
    rule: str | None = Field(None, description="the acceptance rule that decided (measure.acceptance.Rule)")


class UnrealisedIntent(_Strict):
    """A GPU intent that no candidate of the run took up, and why: what the loop missed, for a
    reader (and for a hand change or `--agent llm`) to pick up."""

    intent_id: str
    pattern: str
    spans: list[str] = Field(default_factory=list, description="the intent's source lines, file:first-last")
    reason: str = Field(..., description="no recipe for the pattern (on this target), no recipe recognised the "
                                         "code at those lines, or a recipe matched but the budget ended first")


class RunFinished(_Event):
    event: Literal["run_finished"] = "run_finished"
    final_speedup: float | None
    final_ci: tuple[float, float] | None
    compiled_port_speedup: float | None = None
    final_vs_compiled: float | None = None
    accepted: list[str]
    rejected: list[str]
    done_reason: str = ""
    report_path: str | None = None
    end_to_end: EndToEnd = Field(default_factory=EndToEnd)
    unrealised_intents: list[UnrealisedIntent] = Field(
        default_factory=list, description="GPU intents no candidate took up, each with why (empty in older ledgers)")


class VerifyResult(_Event):
    event: Literal["verify_result"] = "verify_result"
    recorded_speedup: float | None
    measured_speedup: float | None = Field(..., description="None when a timed round could not be believed")
    ci: tuple[float, float] | None
    holds: bool
    min_effect: float | None = Field(None, description="the bar the run decided with, used again here")
    problems: list[str] = Field(default_factory=list, description="rounds dropped because a run failed, and a "
                                                                   "timed run that did other work than the port's")
    port_runs_ms: list[list[float]] = Field(default_factory=list)
    final_runs_ms: list[list[float]] = Field(default_factory=list)


EVENT_TYPES = (RunStarted, RunResumed, PortApplied, BaselineMeasured, EvidenceLoaded, CandidateProposed,
               CandidateValidated, CandidateMeasured, CandidateDecided, RunFinished, VerifyResult)
LedgerEvent = Annotated[
    Union[RunStarted, RunResumed, PortApplied, BaselineMeasured, EvidenceLoaded, CandidateProposed,
          CandidateValidated, CandidateMeasured, CandidateDecided, RunFinished, VerifyResult],
    Field(discriminator="event"),
]
EVENT_ADAPTER: TypeAdapter = TypeAdapter(LedgerEvent)


def parse_event(line: str | bytes) -> BaseModel:
    """One ledger line back into its event model (raises pydantic.ValidationError)."""
    return EVENT_ADAPTER.validate_json(line)


def ledger_schema() -> dict:
    """JSON schema of one ledger line, for reviewers and external tools."""
    schema = EVENT_ADAPTER.json_schema()
    schema["title"] = "TrainBridge ledger event"
    schema["$comment"] = f"ledger schema version {LEDGER_SCHEMA_VERSION}"
    return schema
