"""`trainbridge ledger [verify|measure] RUN_DIR`: review, re-verify or measure a run."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import app, console, user_errors


@app.command("ledger")
@user_errors
def ledger_cmd(
    words: list[str] = typer.Argument(..., metavar="[verify] RUN_DIR",
                                      help="`ledger runs/<id>` shows the table; `ledger verify runs/<id>` re-measures final vs port; "
                                           "`ledger measure runs/<id>` times a dry run's rewrites on the target"),
    pairs: int = typer.Option(3, min=2, help="interleaved rounds: port/final (verify, at least 3) or "
                                             "incumbent/candidate (measure)"),
    salvage: bool = typer.Option(False, "--salvage", help="show: read around damaged lines (each is named) instead "
                                                          "of stopping at the first"),
) -> None:
    """Review a run's accepted and rejected candidates, or re-verify its recorded speedup."""
    from ..ledger.store import Ledger
    from ..ledger.view import render_ledger

    action, rest = (words[0], words[1:]) if words[0] in ("verify", "measure", "show") else ("show", words)
    if len(rest) != 1:
        raise ValueError("usage: trainbridge ledger [verify|measure] runs/<id>")
    run_dir = Path(rest[0])
    path = run_dir / "ledger.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: not a run folder")
    if action == "measure":
        from ..review.measure_dry import measure_dry_run

        measure_dry_run(run_dir, pairs=pairs, console=console)
        return
    if action == "verify":
        from ..review.verify import verify_run

        outcome = verify_run(run_dir, pairs=pairs, console=console)
        raise typer.Exit(0 if outcome.holds else 1)
    render_ledger(Ledger(path, salvage=salvage), console)
