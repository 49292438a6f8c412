"""Re-verify a recorded run from its folder alone: re-measure final vs port now."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..agent.state import RunConfig, RunPaths, read_program
from ..harness.runner import run_workload
from ..measure.statistics import compare
from ..workload import load_workload
from . import models as ev
from .store import Ledger


def verify_run(run_dir: Path, *, pairs: int = 3, console: Console | None = None) -> ev.VerifyResult:
    paths = RunPaths(run_dir)
    cfg = RunConfig.model_validate_json(paths.config.read_text())
    ledger = Ledger(paths.ledger)
    finished = [e for e in ledger.events() if isinstance(e, ev.RunFinished)]
    if not finished:
        raise ValueError(f"{run_dir}: the run has not finished (no RunFinished event): resume it first")
    recorded = finished[-1].final_speedup
    wl = load_workload(cfg.workload)
    port, final = read_program(paths.baseline_dir), read_program(paths.final_dir)
    out = paths.root / "verify"
    arms: dict[str, list[list[float]]] = {"port": [], "final": []}
    for i in range(pairs):
        order = ["port", "final"] if i % 2 == 0 else ["final", "port"]
        for arm in order:
            if console:
                console.print(f"verify: {arm} run {i + 1}/{pairs}")
            r = run_workload(wl, cfg.target, out_dir=out, label=arm, sources=port if arm == "port" else final,
                             seed=cfg.seed)
            if r.status != "ok":
                raise RuntimeError(f"verify: {arm} run {r.status}: {r.error}")
            arms[arm].append(r.measured_ms)
    comp = compare(arms["port"], arms["final"], min_effect=cfg.min_effect, confidence=cfg.confidence)
    # The recorded figure holds if today's interval still clears "no change" and is
    # compatible with it (within 5% of the interval's ends: machine state drifts).
    holds = bool(recorded is not None and comp.ci_low > 1.0
                 and comp.ci_low * 0.95 <= recorded <= comp.ci_high * 1.05)
    result = ev.VerifyResult(
        run_id=cfg.run_id, time_utc=ev.utc_now(), recorded_speedup=recorded, measured_speedup=comp.speedup,
        ci=[comp.ci_low, comp.ci_high], holds=holds, port_runs_ms=arms["port"], final_runs_ms=arms["final"],
    )
    ledger.append(result)
    if console:
        verdict = "[green]holds[/green]" if holds else "[red]does not hold[/red]"
        rec = f"{recorded:.3f}x" if recorded is not None else "none"
        console.print(f"recorded {rec}; measured now {comp.speedup:.3f}x "
                      f"(95% CI {comp.ci_low:.3f}-{comp.ci_high:.3f}): {verdict}")
    return result
