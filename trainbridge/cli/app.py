"""The `trainbridge` command line: init, profile, collect, run, ledger, records, doctor.

Each command is a thin layer over one pipeline stage; errors a user can fix (a bad
manifest, a missing device) are printed as one clear message with exit code 2.
"""

from __future__ import annotations

import functools

import typer
from rich.console import Console
from rich.markup import escape

from ..targets import TARGET_NAMES, TargetUnavailable
from ..workload import ManifestError

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


def main() -> None:  # pragma: no cover - console entry
    app(prog_name="trainbridge")
