"""State of one optimization run, as the LangGraph checkpointer stores it.

Only small JSON-able values live in the state; programs, results and evidence are files in
the run folder (`RunPaths`), so a checkpoint stays cheap and a person can read everything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, TypedDict

from pydantic import BaseModel, Field

from ..targets.registry import TargetName

AgentKind = Literal["recipes", "llm", "llm+recipes"]
EvidenceDevice = Literal["cuda", "cpu"]
TimingScheme = Literal["pairs", "lockstep"]


class RunConfig(BaseModel):
    """The run's inputs, written once to runs/<id>/config.json and read back on --resume."""

    run_id: str
    workload: str
    target: TargetName = "cpu"
    agent: AgentKind = "recipes"
    evidence: str | None = Field(None, description="evidence bundle to use instead of collecting")
    evidence_device: EvidenceDevice = "cuda"
    collect: bool = Field(True, description="collect GPU evidence when no bundle is given")
    allow_no_evidence: bool = Field(False, description="a run without GPU intents may finish with exit 0 "
                                                       "(otherwise its summary, report and exit code say so)")
    budget_candidates: int = 12
    budget_minutes: float = 18.0
    timing_pairs: int = Field(4, description="incumbent/candidate rounds per timing session (look); 4 puts the rule's "
                              "minimum detectable effect near 2% on nanogpt/cpu (benchmarks/calibration.py)")
    looks: int = Field(3, ge=1, description="timing sessions at most per candidate: an undecided one gets more "
                                            "pairs under a group-sequential plan (measure.sequential)")
    timing_scheme: TimingScheme = Field(
        "lockstep", description="how a candidate is timed against the incumbent: process pairs one after the other, or "
                             "both processes alive and taking turns step by step (harness/lockstep.py)")
    baseline_runs: int = Field(6, description="baseline runs, also the A/A calibration sample")
    min_effect: float = Field(0.0, description="smallest speedup fraction to accept (0: the interval must lie above "
                                              "1); raised by the A/A check when the baseline runs are noisier")
    max_false_accept_rate: float = Field(0.05, description="A/A false-accept rate the acceptance rule may have")
    confidence: float = 0.95
    dry_run: bool = False
    compare_compile: bool = True
    llm_model: str | None = None
    llm_base_url: str | None = None
    seed: int = 1337


class RunPaths:
    """Where each artefact of a run lives."""

    def __init__(self, run_dir: str | Path):
        # Absolute, once: these paths reach child processes that run in other folders.
        self.root = Path(run_dir).resolve()

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints.sqlite"

    @property
    def evidence(self) -> Path:
        return self.root / "evidence.json"

    @property
    def profile(self) -> Path:
        return self.root / "profile.json"

    @property
    def baseline_dir(self) -> Path:
        return self.root / "port"

    @property
    def final_dir(self) -> Path:
        return self.root / "final"

    @property
    def harness_dir(self) -> Path:
        return self.root / "harness"

    def candidate_dir(self, cid: str) -> Path:
        return self.root / "candidates" / cid

    @property
    def report(self) -> Path:
        return self.root / "report.md"


def _union(old: list[str] | None, new: list[str] | None) -> list[str]:
    return sorted(set(old or []) | set(new or []))


def _append(old: list[str] | None, new: list[str] | None) -> list[str]:
    return [*(old or []), *(new or [])]


class RunState(TypedDict, total=False):
    """The graph's channels. A node returns a partial update of these keys only: the graph
    refuses any other key (LangGraph itself would drop it without a word). The list channels
    accumulate: a node returns the ids it adds, not the whole list."""

    run_dir: str
    phase: str
    started_at: float
    incumbent_dir: str
    incumbent_id: str
    incumbent_speedup: float
    baseline_median_ms: float
    min_effect: float       # the bar decisions use (the A/A check may raise cfg.min_effect)
    low_precision: bool     # an accepted candidate lowered precision: later ones get the low-precision tolerance
    tried: Annotated[list[str], _union]         # plan keys (recipe@sites) already turned into candidates
    candidates: Annotated[list[str], _append]   # candidate ids in order, repairs included
    accepted: Annotated[list[str], _append]
    rejected: Annotated[list[str], _append]
    # PlanItems (as dicts) of recipe candidates rejected by the clock whose point estimate was
    # above 1 and whose interval reached past the bar: combined into one candidate later
    near_misses: Annotated[list[dict], _append]
    # measure.prediction.Observation dicts: what each measured recipe candidate realised of its
    # raw prediction, so the planner's later predictions for that recipe are calibrated by it
    realised: Annotated[list[dict], _append]
    current: dict | None    # a `Candidate` as `Candidate.to_state()` stores it
    n_candidates: int
    done_reason: str
