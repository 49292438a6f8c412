"""The time budget counts the minutes a run worked, over all its sessions, not the wall clock
since it started: a run killed after 5 of its 18 minutes and resumed a day later still has 13."""

from __future__ import annotations

import datetime as dt

from trainbridge.agent.context import RunContext, active_seconds
from trainbridge.ledger import models as ev

T0 = dt.datetime(2026, 12, 1, 8, 0, tzinfo=dt.timezone.utc)


def _at(minutes: float) -> str:
    return (T0 + dt.timedelta(minutes=minutes)).isoformat(timespec="milliseconds")


def _started(m):
    return ev.RunStarted(run_id="r", time_utc=_at(m), workload="w", target="cpu", agent="recipes",
                         budget_candidates=12, budget_minutes=18, argv=[], environment={})


def _decided(m):
    return ev.CandidateDecided(run_id="r", time_utc=_at(m), candidate_id="c", decision="rejected", reason="x")


def _resumed(m):
    return ev.RunResumed(run_id="r", time_utc=_at(m), argv=[])


def test_a_killed_and_resumed_run_counts_only_its_working_sessions():
    day = 24 * 60
    events = [_started(0), _decided(2), _decided(5),          # killed after its 5th minute
              _resumed(day), _decided(day + 3),                # resumed a day later, killed again
              _resumed(2 * day)]                               # and resumed now
    assert active_seconds(events) == 8 * 60


def test_an_unbroken_run_counts_from_its_start_to_its_last_event():
    assert active_seconds([_started(0), _decided(4.5)]) == 270
    assert active_seconds([]) == 0


def test_the_plan_node_reads_the_active_minutes(monkeypatch):
    ctx = RunContext(cfg=None, workload=None, paths=None, ledger=None, rewriter=None, active_s_before=300,
                     session_started_at=1000.0)
    monkeypatch.setattr("trainbridge.agent.context.time.time", lambda: 1060.0)
    assert ctx.active_minutes() == 6.0
