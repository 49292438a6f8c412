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


# ----------------------------------------------------- the whole run fits --minutes ----
def _ev(kind, m, **kw):
    return kind.model_construct(run_id="r", time_utc=_at(m), **kw)


def _candidate(cid, proposed, validated, measured, rounds=4):
    return [_ev(ev.CandidateProposed, proposed, candidate_id=cid),
            _ev(ev.CandidateValidated, validated, candidate_id=cid),
            _ev(ev.CandidateMeasured, measured, candidate_id=cid, incumbent_runs_ms=[[1.0]] * rounds),
            _ev(ev.CandidateDecided, measured, candidate_id=cid)]


def _estimate(events, elapsed, budget=15.0, **kw):
    from trainbridge.agent.time_budget import estimate

    return estimate(events, budget_min=budget, elapsed_min=elapsed, pairs=4, baseline_runs=6,
                    with_compile=kw.pop("with_compile", True), **kw)


def test_a_candidate_starts_only_when_it_and_the_closing_session_fit():
    """Candidates of 2.5 min whose one look took 2 min: the closing session of three arms takes
    about 3 min, so at 9 minutes of 15 another candidate fits, at 10 it does not (README's
    default run took 19.5 min of a 13-minute budget when only the loop was counted)."""
    events = [_ev(ev.RunStarted, 0), _ev(ev.PortApplied, 0), _ev(ev.BaselineMeasured, 1.6)]
    events += _candidate("c1", 2.0, 2.5, 4.5) + _candidate("c2", 4.5, 5.0, 7.0)
    est = _estimate(events, elapsed=9.0)
    assert (est.candidate_min, est.end_to_end_min) == (2.5, 2.0 * 3 / 2 + 1.6 / 8)
    assert est.fits_another
    late = _estimate(events, elapsed=10.0)
    assert not late.fits_another and "15 min, the end-to-end session included" in late.reason()
    # without the compiled port the session has two arms and no compilation
    assert _estimate(events, elapsed=10.0, with_compile=False).end_to_end_min == 2.0
    # a dry run times nothing at its end
    assert _estimate(events, elapsed=10.0, end_to_end=False).fits_another


def test_a_candidate_that_took_three_looks_counts_one_look_a_third():
    events = [_ev(ev.RunStarted, 0), _ev(ev.PortApplied, 0), _ev(ev.BaselineMeasured, 1.6)]
    events += _candidate("c1", 2.0, 2.5, 8.5, rounds=12)
    est = _estimate(events, elapsed=8.5)
    assert est.end_to_end_min == 2.0 * 3 / 2 + 0.2 and est.candidate_min == 6.5


def test_before_any_candidate_the_baseline_sets_the_pace():
    """6 timed runs + profile + op-count run in 1.6 min: 0.2 min a run; a look is 4 rounds of two."""
    est = _estimate([_ev(ev.RunStarted, 0), _ev(ev.PortApplied, 0), _ev(ev.BaselineMeasured, 1.6)], elapsed=2.0)
    assert abs(est.end_to_end_min - (1.6 * 1.5 + 0.2)) < 1e-9 and abs(est.candidate_min - (1.6 + 0.4)) < 1e-9
    assert est.basis == "the baseline's pace"
    # a 3-minute budget has no room for the first candidate and its closing session
    assert not _estimate([_ev(ev.PortApplied, 0), _ev(ev.BaselineMeasured, 1.6)], elapsed=2.0, budget=3.0).fits_another


def test_a_duration_across_a_resume_is_not_measured():
    """Killed in the middle of a candidate and resumed a day later: that candidate's wall time is
    the user's gap, not the run's pace."""
    day = 24 * 60
    events = [_ev(ev.RunStarted, 0), _ev(ev.PortApplied, 0), _ev(ev.BaselineMeasured, 1.6),
              _ev(ev.CandidateProposed, 2.0, candidate_id="c1"), _ev(ev.RunResumed, day, argv=[]),
              _ev(ev.CandidateValidated, day + 0.5, candidate_id="c1"),
              _ev(ev.CandidateMeasured, day + 2.5, candidate_id="c1", incumbent_runs_ms=[[1.0]] * 4),
              _ev(ev.CandidateDecided, day + 2.5, candidate_id="c1")]
    est = _estimate(events, elapsed=5.0)
    # the look (validated -> measured, both after the resume) is measured; the candidate's span is not,
    # so a candidate is estimated as one look and a validation at the baseline's pace (0.2 min a run)
    assert abs(est.end_to_end_min - (2.0 * 1.5 + 0.2)) < 1e-9 and abs(est.candidate_min - (2.0 + 0.4)) < 1e-9
    assert est.basis.startswith("0 decided candidates")
