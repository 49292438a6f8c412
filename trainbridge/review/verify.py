"""Re-verify a recorded run from its folder alone: re-measure final vs port now.

The same interleaved protocol as the loop (`measure.timing`) and the same bar the run
decided with (its baseline's, A/A-raised if it was), judged by `acceptance.verify_holds`.
Each round's final run is held to the port's run of the same round (work per step, a
backward, the losses): a final program that does less work when re-timed does not hold.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..agent.programs import read_program
from ..agent.state import RunConfig, RunPaths
from ..ledger import models as ev
from ..ledger.store import Ledger
from ..measure.acceptance import MIN_VERIFY_PAIRS, judge, run_bar, verify_holds
from ..measure.timed_runs import same_round_check
from ..measure.timing import interleave, program_arm
from ..workload import load_workload
from .precision import accepted_lower_precision


def verify_run(run_dir: Path, *, pairs: int = 3, console: Console | None = None) -> ev.VerifyResult:
    if pairs < MIN_VERIFY_PAIRS:
        raise ValueError(f"verify needs at least {MIN_VERIFY_PAIRS} pairs to see run-to-run noise, got {pairs}")
    paths = RunPaths(run_dir)
    cfg = RunConfig.model_validate_json(paths.config.read_text())
    ledger = Ledger(paths.ledger)
    events = list(ledger.events())
    finished = [e for e in events if isinstance(e, ev.RunFinished)]
    if not finished:
        raise ValueError(f"{run_dir}: the run has not finished (no RunFinished event): resume it first")
    recorded = finished[-1].final_speedup
    bar = run_bar(events, cfg.min_effect)
    wl = load_workload(cfg.workload)
    out = paths.root / "verify"
    session = interleave(
        {"port": program_arm(wl, cfg.target, read_program(paths.baseline_dir), out_dir=out, label="port", seed=cfg.seed),
         "final": program_arm(wl, cfg.target, read_program(paths.final_dir), out_dir=out, label="final", seed=cfg.seed)},
        pairs, on_run=(lambda arm, i, r: console.print(f"verify: {arm} run {i + 1}/{pairs}")) if console else None,
        check=same_round_check(wl.manifest.correctness, low_precision=accepted_lower_precision(paths, events),
                               incumbent="port", candidate="final"))
    port_runs, final_runs = session.pair("port", "final")
    problems = session.problems + ([f"timed run: {session.violation}"] if session.violation else [])
    if session.violation:
        result = ev.VerifyResult(
            run_id=cfg.run_id, time_utc=ev.utc_now(), recorded_speedup=recorded, measured_speedup=None, ci=None,
            holds=False, min_effect=bar, problems=problems, port_runs_ms=port_runs, final_runs_ms=final_runs)
        ledger.append(result)
        if console:
            console.print(f"[red]does not hold[/red]: {session.violation}")
        return result
    if not port_runs:
        raise RuntimeError("verify: no round of port and final ran through: " + "; ".join(session.problems))
    comp = judge(port_runs, final_runs, bar=bar, confidence=cfg.confidence)
    holds = verify_holds(recorded, comp)
    result = ev.VerifyResult(
        run_id=cfg.run_id, time_utc=ev.utc_now(), recorded_speedup=recorded, measured_speedup=comp.speedup,
        ci=[comp.ci_low, comp.ci_high], holds=holds, min_effect=bar, problems=problems,
        port_runs_ms=port_runs, final_runs_ms=final_runs,
    )
    ledger.append(result)
    if console:
        verdict = "[green]holds[/green]" if holds else "[red]does not hold[/red]"
        rec = f"{recorded:.3f}x" if recorded is not None else "none"
        console.print(f"recorded {rec}; measured now {comp.speedup:.3f}x "
                      f"(95% CI {comp.ci_low:.3f}-{comp.ci_high:.3f}): {verdict}")
        for p in session.problems:
            console.print(f"[yellow]dropped:[/yellow] {p}")
    return result
