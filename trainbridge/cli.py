"""The `trainbridge` command line: profile, collect, run, ledger.

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
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from .targets import TargetUnavailable
from .workload import ManifestError, load_workload

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console(stderr=False)
err_console = Console(stderr=True)



@app.callback()
def _root() -> None:
    """TrainBridge: GPU compilation evidence -> measured, verified rewrites on cpu / cuda / npu."""


TargetOpt = typer.Option("cpu", "--target", "-t", help="cpu | cuda | npu")


def user_errors(fn):
    """Turn the errors a user can act on into a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ManifestError, TargetUnavailable, FileNotFoundError, ValueError) as e:
            err_console.print(f"[red]error:[/red] {e}")
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
    workload: Path = typer.Argument(..., help="workload folder (with trainbridge.toml)"),
    target: str = TargetOpt,
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="output folder (default runs/profile-<name>-<target>)"),
    measured: Optional[int] = typer.Option(None, help="measured steps (default: the manifest's)"),
    profile_steps: int = typer.Option(3, help="steps under torch.profiler, after the measured ones"),
) -> None:
    """Baseline profile: step-time distribution, top operators, fragmentation, verdict."""
    from .harness.runner import run_workload
    from .profile import analyse, render_profile

    wl = load_workload(workload)
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


def main() -> None:  # pragma: no cover - console entry
    app(prog_name="trainbridge")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
