"""`trainbridge ledger show|verify|measure|compare|export` and `trainbridge runs`: review runs.

`trainbridge ledger RUN_DIR` (no command word) still shows the table, as it did before the
ledger had sub-commands.
"""

from __future__ import annotations

import enum
from pathlib import Path

import click
import typer
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from .app import app, console, user_errors


class _ShowByDefault(TyperGroup):
    """A first word that is not a sub-command is a run folder: `ledger RUN_DIR` = `ledger show RUN_DIR`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["show", *args]
        return super().parse_args(ctx, args)


ledger_app = typer.Typer(cls=_ShowByDefault, no_args_is_help=True,
                         help="Review a run: its candidates, a re-verification, a comparison, an export.")
app.add_typer(ledger_app, name="ledger")

RunDir = typer.Argument(..., metavar="RUN_DIR", help="a run folder (runs/<id>)", exists=False)


def _ledger_path(run_dir: Path) -> Path:
    path = Path(run_dir) / "ledger.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: {run_dir} is not a run folder")
    return path


@ledger_app.command("show")
@user_errors
def ledger_show(
    run_dir: Path = RunDir,
    salvage: bool = typer.Option(False, "--salvage", help="read around damaged lines (each is named) instead of "
                                                          "stopping at the first"),
) -> None:
    """Accepted and rejected candidates as a table, with the baseline, final and verify lines."""
    from ..ledger.store import Ledger
    from ..ledger.view import render_ledger

    render_ledger(Ledger(_ledger_path(run_dir), salvage=salvage), console)


@ledger_app.command("verify")
@user_errors
def ledger_verify(
    run_dir: Path = RunDir,
    pairs: int = typer.Option(3, min=3, help="interleaved port/final rounds (at least 3)"),
) -> None:
    """Re-measure final vs port with the loop's acceptance rule; exit 1 when the recorded speedup does not hold."""
    from ..review.verify import verify_run

    _ledger_path(run_dir)
    outcome = verify_run(run_dir, pairs=pairs, console=console)
    raise typer.Exit(0 if outcome.holds else 1)


@ledger_app.command("measure")
@user_errors
def ledger_measure(
    run_dir: Path = RunDir,
    pairs: int = typer.Option(3, min=2, help="interleaved incumbent/candidate rounds per rewrite"),
) -> None:
    """Time a dry run's validated rewrites on the real target."""
    from ..review.measure_dry import measure_dry_run

    _ledger_path(run_dir)
    measure_dry_run(run_dir, pairs=pairs, console=console)


def _cell(c) -> Text:
    if c is None:
        return Text("-", style="dim")
    figure = f" {c.speedup:.3f}x [{c.ci_low:.3f}, {c.ci_high:.3f}]" if c.speedup is not None and c.ci else ""
    style = {"accepted": "green", "rejected": "red"}.get(c.decision, "yellow")
    return Text(f"{c.decision}{figure}", style=style)


@ledger_app.command("report")
@user_errors
def ledger_report(run_dir: Path = RunDir) -> None:
    """Write report.html and report.md again from the run's ledger (a run from an older version, say)."""
    from ..ledger.report import write_report_md
    from ..ledger.report_html import write_report_html
    from ..ledger.store import Ledger

    ledger = Ledger(_ledger_path(run_dir))
    md, page = write_report_md(Path(run_dir), ledger), write_report_html(Path(run_dir), ledger)
    console.print(f"wrote {page} and {md}")


@ledger_app.command("compare")
@user_errors
def ledger_compare(
    run_a: Path = typer.Argument(..., metavar="RUN_A"),
    run_b: Path = typer.Argument(..., metavar="RUN_B"),
) -> None:
    """Two runs of one workload side by side: each mechanism's decision in each, and both verdicts."""
    from ..ledger.compare import compare_runs

    _ledger_path(run_a), _ledger_path(run_b)
    cmp = compare_runs(run_a, run_b)
    table = Table(title=f"{cmp.a.workload_name} on {cmp.a.target}: {cmp.a.run_id} vs {cmp.b.run_id}")
    table.add_column("mechanism", overflow="fold")
    table.add_column(f"A ({cmp.a.run_id})", overflow="fold")
    table.add_column(f"B ({cmp.b.run_id})", overflow="fold")
    for row in cmp.rows:
        table.add_row(Text(row.mechanism), _cell(row.a), _cell(row.b))
    console.print(table)
    console.print(Text(f"A: {cmp.a.verdict}"))
    console.print(Text(f"B: {cmp.b.verdict}"))


class ExportFormat(str, enum.Enum):
    csv = "csv"
    json = "json"
    mlflow = "mlflow"


@ledger_app.command("export")
@user_errors
def ledger_export(
    run_dir: Path = RunDir,
    fmt: ExportFormat = typer.Option(ExportFormat.csv, "--format", "-f",
                                     help="csv, json, or mlflow (needs the [mlflow] extra)"),
    out: Path | None = typer.Option(None, "--out", "-o", help="file to write (default: standard output)"),
    tracking_uri: str | None = typer.Option(None, help="mlflow: the tracking store (default: RUN_DIR/mlruns)"),
    experiment: str | None = typer.Option(None, help="mlflow: the experiment (default: trainbridge-<workload>)"),
) -> None:
    """The run's candidates, one row each (decision, stage, speedup and interval, reason), as CSV or
    JSON; or the run and its candidates as MLflow runs with params, metrics and artifacts."""
    _ledger_path(run_dir)
    if fmt is ExportFormat.mlflow:
        from ..ledger.export_mlflow import export_to_mlflow

        done = export_to_mlflow(run_dir, tracking_uri=tracking_uri, experiment=experiment)
        console.print(f"logged run {done.parent_run_id} with {done.candidate_runs} candidate runs to experiment "
                      f"{done.experiment!r} at {done.tracking_uri}")
        return
    from ..ledger.export import export_text

    text = export_text(run_dir, fmt.value)
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)
        console.print(f"wrote {out}")


@app.command("runs")
@user_errors
def runs_cmd(
    root: Path = typer.Argument(Path("runs"), help="the runs root (`run --runs-root`)"),
) -> None:
    """The runs under a runs root: workload, target, decisions and the verdict, oldest first."""
    from ..ledger.runs_index import list_runs

    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder (give the runs root that `run --runs-root` used)")
    entries = list_runs(root)
    if not entries:
        console.print(f"no runs under {root}")
        return
    table = Table(title=f"runs under {root}")
    for col in ("run", "workload", "target", "accepted", "rejected", "verdict"):
        table.add_column(col, overflow="fold")
    for e in entries:
        table.add_row(Text(Path(e.run_dir).name), Text(e.workload or "-"), Text(e.target or "-"),
                      Text(str(e.accepted)), Text(str(e.rejected)), Text(e.verdict))
    console.print(table)
