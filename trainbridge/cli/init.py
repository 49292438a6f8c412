"""`trainbridge init`: write a trainbridge.toml for a program this tool has never seen."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from .app import TargetOpt, app, console, err_console, user_errors


@app.command()
@user_errors
def init(
    path: Path = typer.Argument(..., metavar="SCRIPT_OR_FOLDER", help="the training script, or the folder holding it"),
    arg: Optional[List[str]] = typer.Option(None, "--arg", help="an argument for a short run (repeat for several)"),
    target: str = TargetOpt,
    probe: bool = typer.Option(True, help="run a few steps to count the work and size the steps"),
    write: bool = typer.Option(False, "--write", "-y", help="write the manifest without asking"),
    force: bool = typer.Option(False, help="replace an existing trainbridge.toml"),
) -> None:
    """Describe a program as a workload: entry, editable files, protected regions, steps, work.

    The manifest is printed first; it is written with --write, or after a yes at the prompt.
    """
    from ..workload_init import InitError, describe, manifest_toml, write_manifest

    try:
        result = describe(path, args=list(arg or []), run_probe=probe, target=target)
    except InitError as e:
        raise ValueError(str(e)) from None
    for note in result.notes:
        console.print(f"- {escape(note)}", soft_wrap=True)
    text = manifest_toml(result.manifest)
    console.print(text, markup=False, highlight=False, soft_wrap=True)
    folder = path.resolve() if path.is_dir() else path.resolve().parent
    if not write:
        if not sys.stdin.isatty():
            err_console.print(f"not written (no terminal to confirm): pass --write to create {folder}/trainbridge.toml")
            raise typer.Exit(1)
        if not typer.confirm(f"write {folder}/trainbridge.toml?"):
            raise typer.Exit(1)
    try:
        written = write_manifest(folder, result.manifest, force=force)
    except InitError as e:
        raise ValueError(str(e)) from None
    console.print(f"wrote {written}; next: trainbridge run {folder}")
