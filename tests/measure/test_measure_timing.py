"""The one interleaved timing protocol: order, pairing, and what a failed run does.

The arms here are scripted (no processes), so each rule is tried exactly: the loop, the
end-to-end report, `ledger verify` and `ledger measure` all go through `interleave`.
"""

from types import SimpleNamespace

import pytest

from trainbridge.measure.statistics import compare
from trainbridge.measure.timing import interleave, round_order


def _scripted(name, log, fail_at=(), ms=10.0):
    """An arm whose n-th own run (0-based) fails when n is in fail_at. Its sample is
    `ms` plus the session-wide call number / 1000, so a sample says when it was taken."""
    calls = {"n": 0}

    def run():
        n = calls["n"]
        calls["n"] += 1
        log.append(name)
        if n in fail_at:
            return SimpleNamespace(status="crashed", error=f"{name} run {n} failed", measured_ms=[])
        return SimpleNamespace(status="ok", error=None, measured_ms=[ms + (len(log) - 1) / 1000])

    return run


def test_the_order_alternates_every_round():
    log = []
    s = interleave({"a": _scripted("a", log), "b": _scripted("b", log), "c": _scripted("c", log)}, 3)
    assert log == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert s.orders == [round_order(["a", "b", "c"], i) for i in range(3)]
    assert s.rounds_kept == 3 and not s.problems


def test_a_failed_run_drops_its_whole_round_so_arms_stay_paired():
    # The end-to-end report once kept the surviving runs of a broken round: the arms came out
    # equal in length but shifted, and `compare` took them for pairs.
    log = []
    arms = {"port": _scripted("port", log), "final": _scripted("final", log, fail_at={1}),
            "compiled_port": _scripted("compiled_port", log)}
    s = interleave(arms, 4)
    # the dropped round is measured again: the session keeps the 4 rounds it planned
    assert s.rounds_kept == 4 and len(s.problems) == 1 and "round 2 of 4 dropped" in s.problems[0]
    # the rest of the failed round is not run: round 2 is reversed, so final was its second run;
    # its replacement runs in the same (reversed) order, so the kept orders still alternate
    assert log[3:5] == ["compiled_port", "final"] and log[5:8] == ["compiled_port", "final", "port"]
    assert s.orders[2] == s.orders[1] and len(s.orders) == 5
    # run k of every arm comes from kept round k: its three samples were taken back to back
    for k in range(s.rounds_kept):
        taken = [round((s.runs_ms[a][k][0] - 10.0) * 1000) for a in s.arms]
        assert max(taken) - min(taken) == 2, (k, taken)
    assert {3, 4} & {round((x[0] - 10.0) * 1000) for a in s.arms for x in s.runs_ms[a]} == set()


def test_dropped_rounds_are_replaced_at_most_twice_and_never_for_a_program_that_never_ran():
    log = []
    s = interleave({"a": _scripted("a", log), "b": _scripted("b", log, fail_at={1, 2, 3, 4})}, 3)
    assert s.rounds_kept == 1 and len(s.problems) == 4 and "replacement round 2 dropped" in s.problems[-1]
    log = []
    s = interleave({"a": _scripted("a", log), "b": _scripted("b", log, fail_at={0, 1, 2})}, 3)
    assert s.rounds_kept == 0 and len(s.problems) == 3  # nothing ever ran: no replacement tried


def test_no_complete_round_leaves_every_arm_empty_and_says_why():
    log = []
    s = interleave({"incumbent": _scripted("incumbent", log), "candidate": _scripted("candidate", log, fail_at={0, 1})},
                   2)
    assert s.runs_ms == {"incumbent": [], "candidate": []}
    assert len(s.problems) == 2 and all("dropped" in p for p in s.problems)


def test_bad_sessions_are_refused():
    with pytest.raises(ValueError):
        interleave({}, 3)
    with pytest.raises(ValueError):
        interleave({"a": _scripted("a", [])}, 0)


def test_a_kept_session_feeds_the_paired_comparison():
    s = interleave({"incumbent": _scripted("incumbent", [], ms=12.0), "candidate": _scripted("candidate", [], ms=10.0)},
                   4)
    comp = compare(*s.pair("incumbent", "candidate"), min_effect=0.02, confidence=0.95)
    assert comp.n_runs_incumbent == comp.n_runs_candidate == 4 and comp.speedup > 1.15


def test_timed_runs_measure_the_manifests_timed_steps_unless_the_caller_says(monkeypatch):
    from trainbridge.measure import timing

    seen = []
    monkeypatch.setattr(timing, "run_workload", lambda wl, target, **kw: seen.append(kw.get("measured_steps")))
    steps = lambda timed: SimpleNamespace(manifest=SimpleNamespace(steps=SimpleNamespace(timed=timed)))  # noqa: E731
    timing.program_arm(steps(50), "cpu", {}, out_dir=".", label="a", seed=0)()
    timing.program_arm(steps(None), "cpu", {}, out_dir=".", label="a", seed=0)()  # unset: the harness's measured
    timing.program_arm(steps(50), "cpu", {}, out_dir=".", label="a", seed=0, measured_steps=7)()
    assert seen == [50, None, 7]
    assert timing.timing_kwargs(steps(50), {"plugins": ["x"]}) == {"measured_steps": 50, "plugins": ["x"]}
