"""The one interleaved timing protocol: the loop, the end-to-end report, `ledger verify` and
`ledger measure` all time programs through `interleave`.

A session is a number of rounds. In each round every arm runs once, in its own process; the
order is reversed every other round (A B, B A, A B ...) so a drift of the machine over the
session falls on every arm alike. A round in which any run fails is dropped whole and its
failure listed: run k of every arm then always comes from round k, which is what the paired
interval in `measure.statistics.compare` assumes of equal-length arms. Dropping a lone run
instead would pair run k of one arm with run k+1 of another. A dropped round is measured
again (`MAX_REPLACED_ROUNDS`), so a broken pair is remeasured rather than leaving the session
short: a look of a sequential plan keeps the size the plan assumes. A kept round whose ratio is
far from every other round of its full session (`measure.outliers`) is dropped and replaced the
same way: a broken pair is remeasured, never averaged into the interval.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from pydantic import BaseModel, Field

from ..harness.lockstep import run_lockstep
from ..harness.models import RunResult
from ..harness.runner import prepare_run, run_workload
from .outliers import contaminated_rounds

RunArm = Callable[[], RunResult]
"""One process of one arm: runs the arm's program once and returns the harness result."""

MAX_REPLACED_ROUNDS = 2
"""Dropped rounds measured again, at most, per session; only once some round of the session was
kept (a program that never runs is not tried again and again)."""


def _round_label(attempt: int, rounds: int) -> str:
    return f"round {attempt + 1} of {rounds}" if attempt < rounds else f"replacement round {attempt + 1 - rounds}"


def _next_round(attempt: int, kept: int, rounds: int) -> bool:
    """Whether to measure another round: until `rounds` are kept, replacing dropped ones while
    the replacements last and the session has kept a round."""
    if kept >= rounds:
        return False
    return attempt < rounds or (kept > 0 and attempt < rounds + MAX_REPLACED_ROUNDS)


class TimingSession(BaseModel):
    """What one interleaved session measured: per arm, the step samples of each kept round."""

    arms: list[str]
    scheme: str = Field("pairs", description="'pairs': one process per arm per round, one after the other; "
                                            "'lockstep': the arms' processes alive together, taking turns per step")
    rounds_planned: int
    runs_ms: dict[str, list[list[float]]] = Field(
        ..., description="arm -> one list of measured step times (ms) per kept round, rounds in order")
    orders: list[list[str]] = Field(default_factory=list, description="the order the arms ran in, per round")
    settle_ms: dict[str, list[list[float]]] = Field(
        default_factory=dict, description="lockstep only: per arm and kept round, how long the arm took to stop "
                                          "running after each step before the other arm was released")
    problems: list[str] = Field(default_factory=list, description="one line per dropped round: which run failed, "
                                                                  "or why its ratio was outlier-contaminated")
    violation: str | None = Field(None, description="a round's results failed the session's check: the session "
                                                    "stopped there, and the runs must not be believed")

    @property
    def rounds_kept(self) -> int:
        return len(self.runs_ms[self.arms[0]]) if self.arms else 0

    def pair(self, a: str, b: str) -> tuple[list[list[float]], list[list[float]]]:
        """Arms a and b, run k of each from round k."""
        return self.runs_ms[a], self.runs_ms[b]


def drop_contaminated(kept: dict[str, list[list[float]]], rounds: int, problems: list[str],
                      settle: dict[str, list[list[float]]] | None = None) -> None:
    """Once the session holds all its rounds, drop the outlier-contaminated ones (in place, every
    arm alike, so run k of each arm still comes from one round); the loop then measures
    replacements while its budget lasts."""
    first = next(iter(kept))
    if len(kept[first]) < rounds:
        return
    for k, why in sorted(contaminated_rounds(kept).items(), reverse=True):
        problems.append(f"kept round {k + 1} of {len(kept[first])} dropped as outlier-contaminated: {why}")
        for table in (kept, settle or {}):
            for runs in table.values():
                if k < len(runs):
                    del runs[k]


def round_order(arms: list[str], round_index: int) -> list[str]:
    """The arms in the order round `round_index` (0-based) runs them: as given, then reversed."""
    return list(arms) if round_index % 2 == 0 else list(reversed(arms))


RoundCheck = Callable[[dict[str, RunResult]], "str | None"]
"""Looks at one complete round (arm -> result); a returned reason stops the session."""


def interleave(arms: dict[str, RunArm], rounds: int, *, on_run: Callable[[str, int, RunResult], None] | None = None,
               check: RoundCheck | None = None) -> TimingSession:
    """Run every arm once per round until `rounds` rounds are kept; a round with a failed run is
    dropped whole and measured again (at most `MAX_REPLACED_ROUNDS` times, once a round was kept).

    The rest of a failed round is not run: its results could not be used. A run whose step
    clock was tampered with (`harness.boundaries`) is no failure to drop: it ends the session
    as a `violation`, like a reason `check` returns. `check` sees each
    complete round; a reason it returns (a timed run that did other work than validation
    saw, say) ends the session with that `violation`, and the round is not kept.
    """
    if not arms:
        raise ValueError("interleave needs at least one arm")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    names = list(arms)
    kept: dict[str, list[list[float]]] = {a: [] for a in names}
    orders, problems, violation = [], [], None
    i = -1
    while _next_round(i + 1, len(kept[names[0]]), rounds):
        i += 1
        order = round_order(names, len(kept[names[0]]))  # a replacement keeps the dropped round's order
        orders.append(order)
        got: dict[str, RunResult] = {}
        for arm in order:
            r = arms[arm]()
            if on_run:
                on_run(arm, i, r)
            if r.status == "tampered":  # not a failed run to drop: the candidate forged its measurement
                violation = f"round {i + 1}: the {arm} run's {r.error}"
                break
            if r.status != "ok":
                problems.append(f"{arm} run {r.status} ({_round_label(i, rounds)} dropped): {(r.error or '')[:300]}")
                break
            got[arm] = r
        if violation:
            break
        if len(got) < len(names):
            continue
        if check is not None and (reason := check(got)):
            violation = f"round {i + 1}: {reason}"
            break
        for arm in names:
            kept[arm].append(list(got[arm].measured_ms))
        drop_contaminated(kept, rounds, problems)
    return TimingSession(arms=names, rounds_planned=rounds, runs_ms=kept, orders=orders, problems=problems,
                         violation=violation)


def timing_kwargs(workload, run_kwargs: dict | None = None) -> dict:
    """Harness options of a timed run: the manifest's `[steps] timed` measured steps (unless the
    caller set them), then the caller's own options."""
    timed = workload.manifest.steps.timed
    return {**({"measured_steps": timed} if timed else {}), **(run_kwargs or {})}


def program_arm(workload, target: str, files: dict[str, str], *, out_dir: Path, label: str, seed: int,
                **run_kwargs) -> RunArm:
    """An arm that runs `files` as the workload's program in a fresh harness process, with the
    manifest's timed steps."""
    kw = timing_kwargs(workload, run_kwargs)
    return lambda: run_workload(workload, target, out_dir=out_dir, label=label, sources=files, seed=seed, **kw)


def candidate_session(workload, target: str, *, incumbent: dict[str, str], candidate: dict[str, str], pairs: int,
                      out_dir: Path, seed: int, on_run: Callable[[str, RunResult], None] | None = None,
                      check: RoundCheck | None = None) -> TimingSession:
    """Incumbent against candidate, `pairs` rounds, arms named `incumbent` and `candidate`."""
    return interleave(
        {"incumbent": program_arm(workload, target, incumbent, out_dir=out_dir, label="incumbent", seed=seed),
         "candidate": program_arm(workload, target, candidate, out_dir=out_dir, label="candidate", seed=seed)},
        pairs, on_run=(lambda arm, i, r: on_run(arm, r)) if on_run else None, check=check)


def lockstep_session(workload, target: str, programs: dict[str, dict[str, str]], rounds: int, *, out_dir: Path,
                     seed: int, check: RoundCheck | None = None,
                     on_round: Callable[[int, dict[str, RunResult]], None] | None = None,
                     run_kwargs: dict[str, dict] | None = None) -> TimingSession:
    """`rounds` lockstep runs of the arms (`harness.lockstep`): each round starts every arm's
    process together and lets them take turns one step at a time, the arm that goes first
    alternating by round. The session has the shape of `interleave`'s, so the same
    statistics and checks apply; a round with a failed arm or an overlapped measured step is
    dropped whole (and measured again, as in `interleave`), a tampered run or a failed `check`
    ends the session. `run_kwargs` gives an arm's own harness options (`runner.prepare_run`:
    plugins, warm-up steps) over the manifest's timed steps."""
    if len(programs) < 2:
        raise ValueError("lockstep needs at least two arms")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    names = list(programs)
    kept: dict[str, list[list[float]]] = {a: [] for a in names}
    settle: dict[str, list[list[float]]] = {a: [] for a in names}
    orders, problems, violation = [], [], None
    i = -1
    while _next_round(i + 1, len(kept[names[0]]), rounds):
        i += 1
        order = round_order(names, len(kept[names[0]]))  # a replacement keeps the dropped round's order
        orders.append(order)
        arms = {a: prepare_run(workload, target, out_dir=Path(out_dir) / a, label=a, sources=programs[a], seed=seed,
                               **timing_kwargs(workload, (run_kwargs or {}).get(a))) for a in names}
        ls = run_lockstep(arms, order)
        if on_round:
            on_round(i, ls.results)
        tampered = next((a for a, r in ls.results.items() if r.status == "tampered"), None)
        if tampered:
            violation = f"round {i + 1}: the {tampered} run's {ls.results[tampered].error}"
            break
        if ls.problem:
            problems.append(f"{_round_label(i, rounds)} dropped: {ls.problem}")
            continue
        if check is not None and (reason := check(ls.results)):
            violation = f"round {i + 1}: {reason}"
            break
        for a in names:
            kept[a].append(list(ls.results[a].measured_ms))
            settle[a].append(ls.settle_ms.get(a, []))
        drop_contaminated(kept, rounds, problems, settle)
    return TimingSession(arms=names, scheme="lockstep", rounds_planned=rounds, runs_ms=kept, orders=orders,
                         problems=problems, violation=violation, settle_ms=settle)
