"""What the loop's nodes share that is not state: the run's inputs, its ledger, the rewriter.

It reaches the nodes as LangGraph's runtime context (`Runtime[RunContext]`), so it is never
checkpointed: on --resume it is rebuilt from the run folder. The helpers here read and write
the ledger the way every node must: log before returning, and reuse what an interrupted
earlier attempt already logged instead of redoing it.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass, field
from typing import Callable

from ..harness.models import RunResult
from ..ledger import models as ev
from ..ledger.store import Ledger
from ..profile.analysis import ProfileReport
from ..workload import Workload
from .evaluate import TrainedWindow
from .rewriters.base import Rewriter
from .state import RunConfig, RunPaths


def active_seconds(events) -> float:
    """Working time of a run's sessions, from its ledger: each session runs from its RunStarted or
    RunResumed event to its last event (a kill loses the time after the last event, never more)."""
    total, start, last = 0.0, None, None
    for e in events:
        t = dt.datetime.fromisoformat(e.time_utc).timestamp()
        if isinstance(e, (ev.RunStarted, ev.RunResumed)):
            if start is not None:
                total += last - start
            start = t
        last = t
    return total + (last - start if start is not None else 0.0)


class PortBlocked(RuntimeError):
    """The program uses a GPU-only construct the port cannot replace (the message names it)."""


@dataclass
class RunContext:
    cfg: RunConfig
    workload: Workload
    paths: RunPaths
    ledger: Ledger
    rewriter: Rewriter | None
    report: Callable[..., None] = field(default=lambda phase, **kw: None)
    active_s_before: float = 0.0  # working seconds of the run's earlier sessions (`active_seconds`)
    session_started_at: float = field(default_factory=time.time)

    def active_minutes(self) -> float:
        """Minutes the run has been working, over all its sessions: the time budget counts these, so a
        run resumed a day after a kill still has the minutes it had left."""
        return (self.active_s_before + time.time() - self.session_started_at) / 60.0

    # ------------------------------------------------------------ ledger ----
    def log(self, event) -> None:
        self.ledger.append(event)

    def base(self) -> dict:
        """The fields every event of this run starts with."""
        return {"run_id": self.cfg.run_id, "time_utc": ev.utc_now()}

    def logged(self, cid: str, kind):
        """The candidate's last event of this kind, if an interrupted earlier attempt wrote it:
        nodes reuse it instead of redoing (and re-logging) finished work on --resume."""
        found = None
        for e in self.ledger.events():
            if isinstance(e, kind) and getattr(e, "candidate_id", None) == cid:
                found = e
        return found

    def logged_once(self, kind):
        """The run's last event of a once-per-run kind (port, baseline, evidence), if an
        interrupted earlier attempt wrote it: a kill between the event and the node's checkpoint
        resumes into the node again, which returns what it returned then instead of redoing
        the work and logging it twice."""
        found = None
        for e in self.ledger.events():
            if isinstance(e, kind):
                found = e
        return found

    def history(self) -> list[str]:
        """What was tried before and why it was rejected (for a model's prompt)."""
        return [f"{c.candidate_id} ({c.pattern}, {c.level}): {c.decision}: {c.reason[:200]}"
                for c in self.ledger.candidates() if c.decision in ("accepted", "rejected")]

    def decide(self, cid: str, decision: str, reason: str, speed: float | None, rule) -> None:
        self.report("decide", candidate=cid, decision=decision, speedup=speed, reason=reason)
        if self.logged(cid, ev.CandidateDecided) is not None:
            return  # decided before an interruption; the checkpoint just had not caught up
        self.log(ev.CandidateDecided(**self.base(), candidate_id=cid, decision=decision, reason=reason,
                                     incumbent_speedup_vs_baseline=speed, rule=getattr(rule, "value", rule)))

    # ---------------------------------------------------- run folder files ----
    def baseline_ref(self) -> RunResult:
        return RunResult.model_validate_json((self.paths.root / "baseline_ref.json").read_text())

    def trained_window(self) -> TrainedWindow | None:
        """The later-window reference (`measure.later_window`), or None where the manifest turns it off."""
        path = self.paths.root / "trained_window.json"
        return TrainedWindow.model_validate_json(path.read_text()) if path.exists() else None

    def profile(self) -> ProfileReport:
        return ProfileReport.model_validate_json(self.paths.profile.read_text())

    def intents(self) -> list[dict]:
        if not self.paths.evidence.exists():
            return []
        return json.loads(self.paths.evidence.read_text()).get("intents", [])
