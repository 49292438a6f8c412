"""`trainbridge records extract|run`: Modded-NanoGPT record comparisons."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .app import TargetOpt, app, console, err_console, user_errors
from .progress import RunProgress

records_app = typer.Typer(no_args_is_help=True, help="Modded-NanoGPT record comparisons: extract, then run.")
app.add_typer(records_app, name="records")
# package data, so an installed wheel has it too (workloads/records/logs in a clone links here)
SHIPPED_SERIES = Path(__file__).resolve().parents[1] / "records" / "shipped_logs"


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

    from ..records.extract import ExtractError, extract

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
    budget: int = typer.Option(3, min=0, help="most candidates per record"),
    minutes: float = typer.Option(3.0, min=0.0, help="time budget per record's run, in minutes, its end-to-end session included"),
    pairs: int = typer.Option(4, min=1, help="interleaved timing pairs per candidate and for the end-to-end figure "
                                           "(2 pairs give a paired interval with one degree of freedom)"),
    looks: int = typer.Option(3, min=1, help="timing sessions at most per candidate: an undecided one is timed again, "
                                      "each look at its group-sequential level (as `trainbridge run --looks`)"),
    baseline_runs: int = typer.Option(4, min=4, help="baseline runs per record"),
    shards: Optional[Path] = typer.Option(None, help="folder with train_*.bin / val_*.bin shards (default: made locally)"),
    collect: bool = typer.Option(False, "--collect/--skip-collect", help="collect GPU evidence per record (slower)"),
    min_run_s: float = typer.Option(4.0, help="size each record's measured steps so one timing run lasts this long "
                                              "(the port check gives the step time; 0 keeps 8 steps)"),
) -> None:
    """Port, scale and optimize each record; write the comparison table and plot."""
    import datetime as dt

    from ..records.compare import RecordsRunOptions, run_records
    from ..records.extract import extract
    from ..records.models import RecordIndex

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
        if source is None and not SHIPPED_SERIES.is_dir():
            raise ValueError(f"no SOURCE given, and the shipped series ({SHIPPED_SERIES}) is missing from this "
                             "installation: give a Modded-NanoGPT checkout's records/ folder or a log file")
        out = out or Path("runs") / f"records-{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}-{target}"
        try:
            wanted = [int(x) for x in only.split(",")] if only else None
        except ValueError:
            raise ValueError(f"--only {only!r}: expected comma-separated record numbers, e.g. 4,12,21") from None
        opts = RecordsRunOptions(
            target=target, source=str(src.resolve()), overrides=_parse_sets(sets),
            shards=str(shards.resolve()) if shards else None, budget_candidates=budget, budget_minutes=minutes,
            timing_pairs=pairs, looks=looks, baseline_runs=baseline_runs, collect=collect, only=wanted,
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
