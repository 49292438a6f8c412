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
        self.decided = 0
        self.budget: int | None = None
        self.deadline: float | None = None

    def plan(self, budget_candidates: int, budget_minutes: float) -> None:
        """Show candidates as i/N and the loop's minutes left (counted from now, as the run's own
        budget is)."""
        import time

        self.budget = budget_candidates
        self.deadline = time.monotonic() + 60 * budget_minutes

    def _where(self) -> str:
        import time

        where = f"candidate {self.candidate}"
        if self.budget is not None:
            where += f" ({min(self.decided + 1, self.budget)}/{self.budget})"
        if self.deadline is not None:
            where += f" | {max(0.0, (self.deadline - time.monotonic()) / 60):.1f} min left"
        return where

    def __call__(self, phase: str, **kw) -> None:
        if kw.get("candidate"):
            self.candidate = kw["candidate"]
        if phase == "decide":
            self.decided += 1
            if kw.get("speedup"):
                self.speedup = kw["speedup"]
            colour = "green" if kw.get("decision") == "accepted" else "yellow"
            why = Text(f": {kw['reason'][:200]}") if kw.get("reason") else Text("")
            self.progress.console.print(Text.assemble(Text(str(kw.get("decision")), style=colour),
                                                      f" {kw.get('candidate')}", why))
        if kw.get("warning"):
            self.progress.console.print(Text(kw["warning"], style="bold red"))
        detail = kw.get("detail", "")
        if not err_console.is_terminal:  # logs and CI: one plain line per event instead of a live bar
            err_console.print(Text(f"{phase} | {self._where()} | incumbent {self.speedup:.2f}x"
                                   + (f" | {detail}" if detail else "")))
        self.progress.update(self.task, description=(
            f"[bold]{phase}[/bold] | {self._where()} | incumbent {self.speedup:.2f}x over port"
            + (f" | {detail}" if detail else "")))

