"""The `trainbridge` command line, one module per command group.

`app` (the typer application, the console-script entry point), the consoles, the shared
options and the user-error handling live in `app`; the commands register on it when their
modules are imported below, in their original registration order.
"""

from __future__ import annotations

from .app import TargetOpt, app, console, err_console, main, user_errors
from .progress import RunProgress, step_progress

# Command modules, imported for their registration on `app`; keep this order (it is the order of --help).
# isort: off
from . import init, profile, collect, run, ledger, records, doctor  # noqa: F401
# isort: on
from .ledger import ledger_app, runs_cmd
from .records import SHIPPED_SERIES, records_app, records_extract, records_run

__all__ = [
    "SHIPPED_SERIES",
    "RunProgress",
    "TargetOpt",
    "app",
    "console",
    "err_console",
    "ledger_app",
    "main",
    "records_app",
    "records_extract",
    "records_run",
    "runs_cmd",
    "step_progress",
    "user_errors",
]
