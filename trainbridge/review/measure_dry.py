"""`trainbridge ledger measure runs/<id>`: time a dry run's validated rewrites on the real target.

A dry run (`--target npu --dry-run`) validates npu rewrites against the CPU references and
stops there: its candidates are `validated_not_measured`. On an Ascend machine this
command measures each of them against the program it was built on (the same interleaved
protocol and bar as the loop), appends the measurements and decisions to the same ledger, then
measures the final program against the port. Nothing is inferred from the dry run itself.

Every timed round is checked as the loop checks it: the candidate's run must do the work its
incumbent's run of the same round did, with the incumbent's losses (both start from the
run's seed on the same machine), so a candidate that behaves only when validated is refused
here too.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..agent.programs import read_program
from ..agent.state import RunConfig, RunPaths
from ..ledger import models as ev
from ..ledger.store import Ledger
from ..measure.acceptance import Rule, judge, rule_of, run_bar
from ..measure.timed_runs import same_round_check
from ..measure.timing import candidate_session
from ..targets import get_target
from ..workload import load_workload
from .precision import chain_lowers_precision


def measure_dry_run(run_dir: Path, *, pairs: int = 3, console: Console | None = None,
                    target: str | None = None) -> list[ev.CandidateDecided]:
    """`target` overrides the run's (tests time a dry run's candidates on the cpu)."""
    paths = RunPaths(run_dir)
    cfg = RunConfig.model_validate_json(paths.config.read_text())
    if not cfg.dry_run:
        raise ValueError(f"{run_dir}: not a dry run; its candidates were measured already")
    target = target or cfg.target
    get_target(target).check_available()  # TargetUnavailable says what is missing
    ledger = Ledger(paths.ledger)
    events = list(ledger.events())
    proposed = {e.candidate_id: e for e in events if isinstance(e, ev.CandidateProposed)}
    done = {e.candidate_id for e in events if isinstance(e, ev.CandidateDecided) and e.decision != "validated_not_measured"}
    pending = [e.candidate_id for e in events if isinstance(e, ev.CandidateDecided)
               and e.decision == "validated_not_measured" and e.candidate_id not in done]
    wl = load_workload(cfg.workload)
    bar = run_bar(events, cfg.min_effect)
    decisions = []
    for cid in pending:
        inc_id = proposed[cid].incumbent
        inc_dir = paths.baseline_dir if inc_id == "port" else paths.candidate_dir(inc_id) / "program"
        session = candidate_session(
            wl, target, incumbent=read_program(inc_dir), candidate=read_program(paths.candidate_dir(cid) / "program"),
            pairs=pairs, out_dir=paths.candidate_dir(cid) / "measured", seed=cfg.seed,
            check=same_round_check(wl.manifest.correctness,
                                   low_precision=chain_lowers_precision(paths, cid, proposed)))
        inc, cand = session.pair("incumbent", "candidate")
        problems = session.problems
        if session.violation:
            d = ev.CandidateDecided(run_id=cfg.run_id, time_utc=ev.utc_now(), candidate_id=cid, decision="rejected",
                                    reason=f"timed run: {session.violation}", rule=Rule.TIMED_RUN_MISMATCH.value)
        elif not inc or not cand:
            d = ev.CandidateDecided(run_id=cfg.run_id, time_utc=ev.utc_now(), candidate_id=cid, decision="rejected",
                                    reason="timing runs failed on the target: " + "; ".join(problems),
                                    rule=Rule.TIMING_RUNS_FAILED.value)
        else:
            comp = judge(inc, cand, bar=bar, confidence=cfg.confidence)
            ledger.append(ev.CandidateMeasured(run_id=cfg.run_id, time_utc=ev.utc_now(), candidate_id=cid,
                                               incumbent_runs_ms=inc, candidate_runs_ms=cand, comparison=comp,
                                               note=f"measured after the dry run, against {inc_id}", problems=problems))
            d = ev.CandidateDecided(run_id=cfg.run_id, time_utc=ev.utc_now(), candidate_id=cid,
                                    decision="accepted" if comp.decision == "accept" else "rejected", reason=comp.reason,
                                    rule=rule_of(comp).value)
        ledger.append(d)
        decisions.append(d)
        if console:
            console.print(f"{cid}: {d.decision} ({d.reason})")
    return decisions
