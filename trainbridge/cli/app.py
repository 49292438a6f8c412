"""The `trainbridge` command line: init, profile, collect, run, ledger, records, doctor.

Each command is a thin layer over one pipeline stage; errors a user can fix (a bad
manifest, a missing device) are printed as one clear message with exit code 2.
"""

from __future__ import annotations

import enum
import functools
import signal
import threading
from typing import get_args

import typer
from rich.console import Console
from rich.markup import escape

from ..targets import TARGET_NAMES, TargetUnavailable
from ..workload import ManifestError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console(stderr=False)
err_console = Console(stderr=True)


def _terminated(signum, frame) -> None:
    """`kill <pid>` ends a command the way Ctrl-C does: every harness child's process tree is
    ended on the way out and the ledger keeps what was decided (`--resume` goes on)."""
    raise KeyboardInterrupt(f"signal {signum}")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            console.print(f"trainbridge {version('trainbridge')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            console.print("trainbridge (not installed)")
        raise typer.Exit()


_debug = {"on": False}  # set by the root --debug option, read by user_errors


def _log_through_rich(debug: bool) -> None:
    """The package's loggers (the LLM rewriter's requests and retries, say) print through rich on
    standard error: warnings always, info with --debug. Attached to the `trainbridge` logger, not
    the root, so a host program's or pytest's own logging set-up is left alone."""
    import logging

    from rich.logging import RichHandler

    logger = logging.getLogger("trainbridge")
    for h in [h for h in logger.handlers if isinstance(h, RichHandler)]:
        logger.removeHandler(h)
    logger.addHandler(RichHandler(console=err_console, show_path=debug, rich_tracebacks=debug, markup=False))
    logger.setLevel(logging.INFO if debug else logging.WARNING)


@app.callback()
def _root(
    _version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                  help="print the version and exit"),
    debug: bool = typer.Option(False, "--debug", help="show the full traceback of an error, and the info log"),
) -> None:
    """TrainBridge: GPU compilation evidence -> measured, verified rewrites on cpu / cuda / npu."""
    _debug["on"] = debug
    _log_through_rich(debug)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)


def choices(name: str, literal) -> type[enum.Enum]:
    """A str Enum of a Literal's values, for a typer option: the Literal (in the config models)
    stays the one table of what is allowed; the CLI shows and checks the same values."""
    return enum.Enum(name, {v: v for v in get_args(literal)}, type=str)


def _known_target(value: str) -> str:
    if value not in TARGET_NAMES:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(TARGET_NAMES)}")
    return value


TargetOpt = typer.Option("cpu", "--target", "-t", callback=_known_target,
                         help=f"where the program runs and is measured: {' | '.join(TARGET_NAMES)}")


def user_errors(fn):
    """Turn the errors a user can act on into a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ManifestError, TargetUnavailable, FileNotFoundError, ValueError) as e:
            if _debug["on"]:
                raise
            err_console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def main() -> None:  # pragma: no cover - console entry
    app(prog_name="trainbridge")
