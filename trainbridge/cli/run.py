"""`trainbridge run`: optimize a workload (or resume a run), then show its ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from ..agent.state import AgentKind, EvidenceDevice, TimingScheme
from ..workload import load_workload
from .app import TargetOpt, app, choices, console, err_console, user_errors
from .progress import RunProgress

# `--help` lists each option's choices, and typer refuses any other value before anything runs
AgentChoice = choices("AgentChoice", AgentKind)
EvidenceChoice = choices("EvidenceChoice", EvidenceDevice)
TimingChoice = choices("TimingChoice", TimingScheme)


@app.command()
@user_errors
def run(
    workload: Optional[Path] = typer.Argument(None, help="workload folder (with trainbridge.toml)"),
    target: str = TargetOpt,
    resume: Optional[Path] = typer.Option(None, "--resume", help="continue runs/<id> after a crash or Ctrl-C"),
    evidence: Optional[Path] = typer.Option(None, "--evidence", help="evidence bundle from `trainbridge collect`"),
    evidence_device: EvidenceChoice = typer.Option("cuda", help="device whose compiler decisions to collect"),
    agent: AgentChoice = typer.Option("recipes", help="who writes the candidates: the recipe library, a model, "
                                                     "or both"),
    model: Optional[str] = typer.Option(None, "--model", help="LLM model name (--agent llm)"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint (or OPENAI_BASE_URL)"),
    budget: int = typer.Option(10, min=0, help="most candidates to try"),
    minutes: float = typer.Option(15.0, min=0.0, help="time budget for the whole run in working minutes, its closing "
                                                     "end-to-end session included: a candidate starts only when it "
                                                     "and that session are expected to fit"),
    pairs: int = typer.Option(4, min=1, help="incumbent/candidate rounds per timing session (look)"),
    looks: int = typer.Option(3, min=1, help="timing sessions at most per candidate: an undecided one is timed again, "
                                      "each look at a group-sequential level (1 = one session, no second look)"),
    timing: TimingChoice = typer.Option("lockstep", help="lockstep (both programs alive, taking turns step by step; "
                                                "benchmarks/calibration.py) | pairs (one process after the other)"),
    baseline_runs: int = typer.Option(6, min=4, help="baseline runs (also the A/A calibration sample)"),
    skip_collect: bool = typer.Option(False, "--skip-collect",
                                      help="plan from the target profile only, without GPU evidence"),
    allow_no_evidence: bool = typer.Option(False, "--allow-no-evidence",
                                           help="finish with exit 0 even when GPU evidence was asked for "
                                                "(collected or --evidence) and none could be had"),
    dry_run: bool = typer.Option(False, "--dry-run", help="npu only: validate rewrites on the CPU with torch_npu "
                                                          "references; measure later with `ledger measure`"),
    no_compile_compare: bool = typer.Option(False, "--no-compile-compare",
                                            help="skip timing torch.compile of the port at the end"),
    runs_root: Path = typer.Option(Path("runs"), help="where run folders go"),
) -> None:
    """Optimize a workload: port, profile, collect, then plan/rewrite/validate/measure/decide.

    Exit codes: 0 done; 2 a usage or input error (nothing ran); 3 the run finished but had no
    GPU evidence although it was asked for some (see --allow-no-evidence, --skip-collect).
    """
    from ..agent.run import new_run_id, resume_run, start_run
    from ..agent.state import RunConfig
    from ..ledger.store import Ledger
    from ..ledger.summary import EXIT_NO_EVIDENCE, evidence_event, evidence_line
    from ..ledger.view import render_ledger

    if evidence is not None and not resume:
        _check_evidence_file(evidence, allow_empty=allow_no_evidence)

    reporter = RunProgress()
    with reporter.progress:
        if resume:
            run_dir = resume_run(resume, reporter)
        else:
            if workload is None:
                raise ValueError("give a workload folder, or --resume runs/<id>")
            wl = load_workload(workload)
            runs_root = _outside(runs_root, wl.root)
            if dry_run and target != "npu":
                raise ValueError("--dry-run is for --target npu (other targets are measured here)")
            if looks < 1:
                raise ValueError(f"--looks {looks}: at least 1")
            cfg = RunConfig(
                run_id=new_run_id(wl.manifest.name, target), workload=str(wl.root), target=target,
                agent=agent.value, evidence=str(evidence.resolve()) if evidence else None,
                evidence_device=evidence_device.value, budget_candidates=budget, budget_minutes=minutes,
                timing_pairs=pairs, timing_scheme=timing.value, looks=looks,
                baseline_runs=baseline_runs,
                collect=not skip_collect, allow_no_evidence=allow_no_evidence, dry_run=dry_run,
                compare_compile=not no_compile_compare, llm_model=model, llm_base_url=base_url,
            )
            reporter.plan(cfg.budget_candidates, cfg.budget_minutes)
            run_dir = start_run(cfg, runs_root, reporter)
    ledger = Ledger(run_dir / "ledger.jsonl")
    render_ledger(ledger, console)
    console.print(f"run folder: {run_dir}  (report: {run_dir / 'report.md'})")
    found = evidence_event(ledger.events())
    if found is not None and found.missing:
        err_console.print(Text(evidence_line(found), style="bold red"))
        raise typer.Exit(EXIT_NO_EVIDENCE)


def _outside(runs_root: Path, workload_root: Path) -> Path:
    """Run folders never go inside the workload (run from inside it, `runs/` would land there and
    every later run would carry the earlier runs' programs): next to it instead, said so."""
    here, wl = runs_root.resolve(), workload_root.resolve()
    if here != wl and wl not in here.parents:
        return runs_root
    moved = wl.parent / "runs"
    console.print(f"note: {runs_root} lies inside the workload folder {wl}; run folders go to {moved}")
    return moved


def _check_evidence_file(path: Path, *, allow_empty: bool) -> None:
    """A given --evidence bundle must load, and hold intents, before minutes of baseline runs."""
    from pydantic import ValidationError

    from ..evidence.bundle import EvidenceBundle

    if not path.is_file():
        raise ValueError(f"--evidence {path}: no such file (write one with `trainbridge collect W -o {path.name}`)")
    try:
        bundle = EvidenceBundle.load(path)
    except (ValidationError, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"--evidence {path}: not an evidence bundle trainbridge can read ({first})") from None
    if not bundle.intents and not allow_empty:
        raise ValueError(f"--evidence {path}: the bundle has no optimization intents; "
                         "pass --allow-no-evidence to plan from the target profile only")
