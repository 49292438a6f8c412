"""`trainbridge doctor`: what a target needs, what is installed, and how to fix what is missing."""

from __future__ import annotations

import typer

from ..targets import TARGET_NAMES
from .app import TargetOpt, app, console, user_errors


@app.command()
@user_errors
def doctor(target: str = TargetOpt) -> None:
    """What the target needs, what is installed here, and how to fix what is missing."""
    from rich.table import Table

    from ..targets.doctor import diagnose

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
