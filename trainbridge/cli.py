"""The `trainbridge` command line: profile, collect, run, ledger, records, doctor.

Each command is a thin layer over one pipeline stage; errors a user can fix (a bad
manifest, a missing device) are printed as one clear message with exit code 2.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from .targets import TARGET_NAMES, TargetUnavailable
from .workload import ManifestError, load_workload

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console(stderr=False)
err_console = Console(stderr=True)



@app.callback()
def _root() -> None:
    """TrainBridge: GPU compilation evidence -> measured, verified rewrites on cpu / cuda / npu."""


TargetOpt = typer.Option("cpu", "--target", "-t", help=" | ".join(TARGET_NAMES))


def user_errors(fn):
    """Turn the errors a user can act on into a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ManifestError, TargetUnavailable, FileNotFoundError, ValueError) as e:
            err_console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def step_progress(total: int, description: str):
    """A rich progress bar fed by the harness's per-step callback."""
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
        TextColumn("{task.fields[last]}"), TimeElapsedColumn(), console=err_console, transient=False,
    )
    task = progress.add_task(description, total=total, last="")

    def on_step(step):
        progress.update(task, completed=step.index, last=f"{step.phase} {step.step_ms:.0f} ms")

    return progress, on_step


@app.command()
@user_errors
def profile(
    path: Path = typer.Argument(..., metavar="DIR", help="a workload folder (with trainbridge.toml) to run and profile, "
                                                        "or a torch_npu profiler folder to analyse: *_ascend_pt, its "
                                                        "ASCEND_PROFILER_OUTPUT, or a parent of one or more (one per rank)"),
    target: str = TargetOpt,
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="output folder (default runs/profile-<name>-<target>)"),
    measured: Optional[int] = typer.Option(None, help="measured steps (default: the manifest's)"),
    profile_steps: int = typer.Option(3, help="steps under torch.profiler, after the measured ones"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="profiler folder: write the AscendProfileReport as "
                                                               "JSON here (a JSON list of them for several ranks)"),
    top: int = typer.Option(10, "--top", help="profiler folder: findings to print (--json keeps them all)"),
) -> None:
    """Baseline profile of a workload, or the analysis of an Ascend profile you already have.

    `profile W --target cpu` runs workload W: step times, top operators, verdict; writes profile.json.

    `profile DIR` reads a torch_npu profiler folder (no run): verdict, step breakdown, findings, suggestions.
    """
    if not _is_workload(path):
        if out is not None or measured is not None:
            raise ValueError(f"{path}: not a workload (no trainbridge.toml); --out and --measured are for profiling "
                             "a workload (use --json FILE to keep the analysis of a profiler folder)")
        _analyse_profile_folder(path, json_out, top)
        return
    if json_out is not None:
        raise ValueError("--json is for analysing a profiler folder; profiling a workload writes profile.json under --out")
    from .harness.runner import run_workload
    from .profile import analyse, render_profile

    wl = load_workload(path)
    m = wl.manifest
    out = out or Path("runs") / f"profile-{m.name}-{target}"
    total = m.steps.warmup + (measured or m.steps.measured) + profile_steps + 2
    progress, on_step = step_progress(total, f"profiling {m.name} on {target}")
    with progress:
        result = run_workload(
            wl, target, out_dir=out, label="profile", measured_steps=measured,
            profile_steps=profile_steps, count_ops=True, count_flops=True, on_step=on_step,
        )
    if not result.ok:
        err_console.print(f"[red]run {result.status}:[/red] {result.error}")
        raise typer.Exit(1)
    report = analyse(result, m.name)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(report.model_dump_json(indent=1))
    render_profile(report, console)
    console.print(f"wrote {out / 'profile.json'}")


def _is_workload(path: Path) -> bool:
    from .workload import MANIFEST_NAME

    return (path / MANIFEST_NAME).is_file() or (path.name == MANIFEST_NAME and path.is_file())


def _analyse_profile_folder(path: Path, json_out: Optional[Path], top: int) -> None:
    """`trainbridge profile DIR` on a torch_npu profiler folder: one report per rank folder found."""
    from pydantic import TypeAdapter

    from .profile.ascend import (
        AscendProfileError,
        AscendProfileReport,
        PyTorchTraceOnly,
        analyse_ranks,
    )
    from .profile.ascend.render import render_ascend_report, render_rank_summary

    if json_out is not None and json_out.is_dir():
        raise ValueError(f"--json {json_out}: is a folder; give a file name, e.g. {json_out / 'ascend_profile.json'}")
    try:
        ranks = analyse_ranks(path, top=top)
    except PyTorchTraceOnly:
        raise
    except AscendProfileError as e:
        if path.is_dir():
            raise AscendProfileError(f"{e} (nor is it a workload: no trainbridge.toml)") from None
        raise
    if len(ranks) == 1 and isinstance(ranks[0][1], AscendProfileError):
        raise ranks[0][1]
    rows: list[tuple[str, AscendProfileReport | None]] = []
    for i, (folder, result) in enumerate(ranks, 1):
        name = folder.parent.name if folder.name == "ASCEND_PROFILER_OUTPUT" else folder.name
        title = f"rank {i}/{len(ranks)}: {name}" if len(ranks) > 1 else None
        if isinstance(result, AscendProfileError):
            err_console.print(Text(f"warning: {name}: not analysed: {result}", style="yellow"), soft_wrap=True)
            rows.append((name, None))
            continue
        if i > 1:
            console.print()
        render_ascend_report(result, console, title=title, top=top)
        rows.append((name, result))
    reports = [r for _, r in rows if r is not None]
    if not reports:
        raise AscendProfileError(f"{path}: no profiler folder could be analysed "
                                 f"({len(ranks)} found, none readable; see the warnings above)")
    if len(ranks) > 1:
        console.print()
        render_rank_summary(rows, console)
    if json_out is not None:
        data = (reports[0].model_dump_json(indent=1) if len(ranks) == 1 else
                TypeAdapter(list[AscendProfileReport]).dump_json(reports, indent=1).decode())
        try:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(data)
        except OSError as e:
            raise ValueError(f"--json {json_out}: cannot write ({e.strerror or e})") from None
        console.print(f"wrote {json_out}")


@app.command()
@user_errors
def collect(
    workload: Path = typer.Argument(..., help="workload folder (with trainbridge.toml)"),
    device: str = typer.Option("cuda", "--device", help="whose compiler decisions: cuda (Triton, GPU or not) | cpu"),
    out: Path = typer.Option(Path("evidence.json"), "--out", "-o", help="evidence bundle to write"),
    import_debug: Optional[Path] = typer.Option(None, "--import", help="a TORCH_COMPILE_DEBUG folder or output_code.py from a GPU run"),
) -> None:
    """GPU compilation evidence: Inductor kernels -> supernodes -> optimization intents."""
    import time

    from .evidence.bundle import render_summary

    wl = load_workload(workload)
    t0 = time.perf_counter()
    if import_debug is not None:
        from .evidence.importer import import_debug_output

        bundle = import_debug_output(import_debug, source_root=wl.root)
    else:
        if device not in ("cuda", "cpu"):
            raise ValueError(f"--device {device}: choose cuda or cpu")
        from .evidence.collect import collect_workload

        with err_console.status(f"compiling {wl.manifest.name} with Inductor ({device} kernels) ..."):
            bundle = collect_workload(wl, device=device, out_dir=out.parent / f".collect-{wl.manifest.name}")
    bundle.save(out)
    render_summary(bundle, console)
    console.print(f"wrote {out} ({bundle.route}, {time.perf_counter() - t0:.0f} s)")


class RunProgress:
    """Phase, candidate and incumbent speedup of a run, on one live line plus a log of decisions."""

    def __init__(self):
        from rich.progress import SpinnerColumn

        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                 console=err_console)
        self.task = self.progress.add_task("starting", total=None)
        self.speedup = 1.0
        self.candidate = "-"

    def __call__(self, phase: str, **kw) -> None:
        if kw.get("candidate"):
            self.candidate = kw["candidate"]
        if phase == "decide":
            if kw.get("speedup"):
                self.speedup = kw["speedup"]
            colour = "green" if kw.get("decision") == "accepted" else "yellow"
            self.progress.console.print(f"[{colour}]{kw.get('decision')}[/{colour}] {kw.get('candidate')}")
        if kw.get("warning"):
            self.progress.console.print(Text(kw["warning"], style="bold red"))
        detail = kw.get("detail", "")
        if not err_console.is_terminal:  # logs and CI: one plain line per event instead of a live bar
            err_console.print(f"{phase} | candidate {self.candidate} | incumbent {self.speedup:.2f}x"
                              + (f" | {detail}" if detail else ""))
        self.progress.update(self.task, description=(
            f"[bold]{phase}[/bold] | candidate {self.candidate} | incumbent {self.speedup:.2f}x over port"
            + (f" | {detail}" if detail else "")))


@app.command()
@user_errors
def run(
    workload: Optional[Path] = typer.Argument(None, help="workload folder (with trainbridge.toml)"),
    target: str = TargetOpt,
    resume: Optional[Path] = typer.Option(None, "--resume", help="continue runs/<id> after a crash or Ctrl-C"),
    evidence: Optional[Path] = typer.Option(None, "--evidence", help="evidence bundle from `trainbridge collect`"),
    evidence_device: str = typer.Option("cuda", help="device whose compiler decisions to collect: cuda | cpu"),
    agent: str = typer.Option("recipes", help="recipes | llm | llm+recipes"),
    model: Optional[str] = typer.Option(None, "--model", help="LLM model name (--agent llm)"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint (or OPENAI_BASE_URL)"),
    budget: int = typer.Option(10, help="most candidates to try"),
    minutes: float = typer.Option(13.0, help="time budget for port + baseline + loop, in minutes (the final measurement follows)"),
    pairs: int = typer.Option(3, help="interleaved incumbent/candidate run pairs per candidate"),
    baseline_runs: int = typer.Option(6, help="baseline runs (also the A/A calibration sample, >= 4)"),
    skip_collect: bool = typer.Option(False, help="plan from the target profile only, without GPU evidence"),
    allow_no_evidence: bool = typer.Option(False, help="finish with exit 0 even when GPU evidence was asked for "
                                                       "(collected or --evidence) and none could be had"),
    dry_run: bool = typer.Option(False, "--dry-run", help="npu only: validate rewrites on the CPU with torch_npu references; measure later with `ledger measure`"),
    no_compile_compare: bool = typer.Option(False, help="skip timing torch.compile of the port at the end"),
    runs_root: Path = typer.Option(Path("runs"), help="where run folders go"),
) -> None:
    """Optimize a workload: port, profile, collect, then plan/rewrite/validate/measure/decide.

    Exit codes: 0 done; 2 a usage or input error (nothing ran); 3 the run finished but had no
    GPU evidence although it was asked for some (see --allow-no-evidence, --skip-collect).
    """
    from .agent.run import new_run_id, resume_run, start_run
    from .agent.state import RunConfig
    from .ledger.store import Ledger
    from .ledger.summary import EXIT_NO_EVIDENCE, evidence_event, evidence_line
    from .ledger.view import render_ledger

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
            if dry_run and target != "npu":
                raise ValueError("--dry-run is for --target npu (other targets are measured here)")
            if agent not in ("recipes", "llm", "llm+recipes"):
                raise ValueError(f"--agent {agent}: choose recipes, llm or llm+recipes")
            cfg = RunConfig(
                run_id=new_run_id(wl.manifest.name, target), workload=str(wl.root), target=target,
                agent=agent, evidence=str(evidence.resolve()) if evidence else None, evidence_device=evidence_device,
                budget_candidates=budget, budget_minutes=minutes, timing_pairs=pairs, baseline_runs=baseline_runs,
                collect=not skip_collect, allow_no_evidence=allow_no_evidence, dry_run=dry_run,
                compare_compile=not no_compile_compare, llm_model=model, llm_base_url=base_url,
            )
            run_dir = start_run(cfg, runs_root, reporter)
    ledger = Ledger(run_dir / "ledger.jsonl")
    render_ledger(ledger, console)
    console.print(f"run folder: {run_dir}  (report: {run_dir / 'report.md'})")
    found = evidence_event(ledger.events())
    if found is not None and found.missing:
        err_console.print(Text(evidence_line(found), style="bold red"))
        raise typer.Exit(EXIT_NO_EVIDENCE)


def _check_evidence_file(path: Path, *, allow_empty: bool) -> None:
    """A given --evidence bundle must load, and hold intents, before minutes of baseline runs."""
    from pydantic import ValidationError

    from .evidence.bundle import EvidenceBundle

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


@app.command("ledger")
@user_errors
def ledger_cmd(
    words: list[str] = typer.Argument(..., metavar="[verify] RUN_DIR",
                                      help="`ledger runs/<id>` shows the table; `ledger verify runs/<id>` re-measures final vs port; "
                                           "`ledger measure runs/<id>` times a dry run's rewrites on the target"),
    pairs: int = typer.Option(3, help="interleaved port/final pairs (verify)"),
) -> None:
    """Review a run's accepted and rejected candidates, or re-verify its recorded speedup."""
    from .ledger.store import Ledger
    from .ledger.view import render_ledger

    action, rest = (words[0], words[1:]) if words[0] in ("verify", "measure", "show") else ("show", words)
    if len(rest) != 1:
        raise ValueError("usage: trainbridge ledger [verify|measure] runs/<id>")
    run_dir = Path(rest[0])
    path = run_dir / "ledger.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: not a run folder")
    if action == "measure":
        from .review.measure_dry import measure_dry_run

        measure_dry_run(run_dir, pairs=pairs, console=console)
        return
    if action == "verify":
        from .review.verify import verify_run

        outcome = verify_run(run_dir, pairs=pairs, console=console)
        raise typer.Exit(0 if outcome.holds else 1)
    render_ledger(Ledger(path), console)


records_app = typer.Typer(no_args_is_help=True, help="Modded-NanoGPT record comparisons: extract, then run.")
app.add_typer(records_app, name="records")
REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_SERIES = REPO_ROOT / "workloads" / "records" / "logs"


def _parse_sets(sets: list[str]) -> dict[str, object]:
    """`--set layers=4 --set lr=0.01` -> {"layers": 4, "lr": 0.01} (int, float, bool, else str)."""
    out: dict[str, object] = {}
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected NAME=VALUE")
        value: object = raw
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                pass
        if raw in ("true", "false", "True", "False"):
            value = raw.lower() == "true"
        out[key] = value
    return out


@records_app.command("extract")
@user_errors
def records_extract(
    path: Path = typer.Argument(..., help="a Modded-NanoGPT checkout, or a folder of its logs"),
    out: Path = typer.Option(Path("records.json"), "--out", "-o", help="where to write the extracted records"),
) -> None:
    """Each record's number, name, script (from its log, extra files too) and GPU timings."""
    from rich.table import Table

    from .records.extract import ExtractError, extract

    try:
        index = extract(path)
    except ExtractError as e:
        raise ValueError(str(e)) from None
    out.write_text(index.model_dump_json(indent=1))
    table = Table(title=f"records under {path}")
    for col in ("record", "name", "README time", "logs", "script", "train_time", "step_avg", "val_loss"):
        table.add_column(col)
    for r in index.records:
        script = (f"{len(r.script.splitlines())} lines" + (f" + {len(r.extra_files)} files" if r.extra_files else "")
                  if r.script else f"[yellow]none[/yellow]: {r.no_script_reason}")
        table.add_row(str(r.num if r.num is not None else "?"), r.name, r.readme_time or "-", str(len(r.logs)), script,
                      f"{r.reference_train_time_ms:.0f} ms" if r.reference_train_time_ms is not None else "-",
                      f"{r.reference_step_avg_ms:.2f} ms" if r.reference_step_avg_ms is not None else "-",
                      f"{r.reference_val_loss:.4f}" if r.reference_val_loss is not None else "-")
    console.print(table)
    console.print(f"wrote {out} ({len(index.records)} records, {sum(r.script is not None for r in index.records)} with a script)")


@records_app.command("run")
@user_errors
def records_run(
    source: Optional[Path] = typer.Argument(None, help="records.json from `records extract`, a checkout or a log folder "
                                                      "(default: the shipped record-style series)"),
    target: str = TargetOpt,
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="output folder (default runs/records-<time>-<target>)"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="go on with an interrupted `records run` in this "
                                                                "output folder (same options)"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="with --resume: run again the records whose "
                                                                    "answer was a failure (after updating TrainBridge)"),
    sets: list[str] = typer.Option([], "--set", help="scale override KNOB=VALUE or FIELD=VALUE (see docs/records.md)"),
    only: Optional[str] = typer.Option(None, help="comma-separated record numbers to run"),
    track: int = typer.Option(1, help="records of this track (1: the short track; 0: every track)"),
    port_only: bool = typer.Option(False, "--port-only", help="port, scale and train a few real steps per record "
                                                              "(loss finite and falling); no optimization loop"),
    budget: int = typer.Option(3, help="most candidates per record"),
    minutes: float = typer.Option(3.0, help="loop time budget per record, in minutes"),
    pairs: int = typer.Option(3, help="interleaved timing pairs per candidate and for the end-to-end figure "
                                           "(2 pairs give a paired interval with one degree of freedom)"),
    baseline_runs: int = typer.Option(4, help="baseline runs per record (>= 4)"),
    shards: Optional[Path] = typer.Option(None, help="folder with train_*.bin / val_*.bin shards (default: made locally)"),
    collect: bool = typer.Option(False, "--collect/--skip-collect", help="collect GPU evidence per record (slower)"),
    min_run_s: float = typer.Option(4.0, help="size each record's measured steps so one timing run lasts this long "
                                              "(the port check gives the step time; 0 keeps 8 steps)"),
) -> None:
    """Port, scale and optimize each record; write the comparison table and plot."""
    import datetime as dt

    from .records.compare import RecordsRunOptions, run_records
    from .records.extract import extract
    from .records.models import RecordIndex

    if retry_failed and resume is None:
        raise ValueError("--retry-failed goes with --resume OUT (the output folder whose failures to run again)")
    if resume is not None:
        saved = resume / "records_run.json"
        if not saved.is_file():
            raise ValueError(f"--resume {resume}: no records_run.json there (not a `records run` output folder)")
        opts = RecordsRunOptions.model_validate_json(saved.read_text())
        out = resume
        src = Path(opts.source)
    else:
        src = source or SHIPPED_SERIES
        out = out or Path("runs") / f"records-{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}-{target}"
        try:
            wanted = [int(x) for x in only.split(",")] if only else None
        except ValueError:
            raise ValueError(f"--only {only!r}: expected comma-separated record numbers, e.g. 4,12,21") from None
        opts = RecordsRunOptions(
            target=target, source=str(src.resolve()), overrides=_parse_sets(sets),
            shards=str(shards.resolve()) if shards else None, budget_candidates=budget, budget_minutes=minutes,
            timing_pairs=pairs, baseline_runs=baseline_runs, collect=collect, only=wanted,
            track=track or None, min_run_s=min_run_s, port_only=port_only)
    if src.is_file() and src.suffix == ".json":
        index = RecordIndex.model_validate_json(src.read_text())
    else:
        index = extract(src)

    def announce(entry):
        what = "port check" if opts.port_only else \
            f"port, scale, optimize ({opts.budget_candidates} candidates, {opts.budget_minutes:g} min)"
        console.print(f"[bold]record {entry.num if entry.num is not None else entry.key}[/bold] {entry.name}: {what}")

    reporter = RunProgress()
    try:
        with reporter.progress:
            results = run_records(index, out, opts, reporter=reporter, on_record=announce,
                                  resume=resume is not None, retry_failed=retry_failed)
    except KeyboardInterrupt:
        err_console.print(f"[yellow]interrupted[/yellow]: finished records are in {out / 'records_results.json'}; "
                          f"`trainbridge records run --resume {out}` goes on")
        raise typer.Exit(130) from None
    console.print((out / "records_table.md").read_text())
    console.print(f"wrote {out / 'records_table.md'}, {out / 'records_results.json'}, {out / 'records_speedup.png'}")
    if not any(r.status in ("measured", "port_ok") for r in results):
        raise typer.Exit(1)


@app.command()
@user_errors
def doctor(target: str = TargetOpt) -> None:
    """What the target needs, what is installed here, and how to fix what is missing."""
    from rich.table import Table

    from .targets.doctor import diagnose

    if target not in TARGET_NAMES:
        raise ValueError(f"--target {target}: choose cpu, cuda or npu")
    checks = diagnose(target)
    table = Table(title=f"trainbridge doctor --target {target}")
    for col in ("check", "status", "found", "fix"):
        table.add_column(col)
    for c in checks:
        table.add_row(c.name, "[green]ok[/green]" if c.ok else "[red]missing[/red]", c.found, c.fix)
    console.print(table)
    raise typer.Exit(0 if all(c.ok for c in checks) else 1)


def main() -> None:  # pragma: no cover - console entry
    app(prog_name="trainbridge")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
