"""Live progress displays of the commands: a per-step bar, and a run's phase/candidate line."""

from __future__ import annotations

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from .app import err_console


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

