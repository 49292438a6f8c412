"""`trainbridge ledger runs/<id>`: accepted and rejected candidates as a table."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .models import BaselineMeasured, RunFinished
from .store import Ledger


def render_ledger(ledger: Ledger, console: Console) -> None:
    events = list(ledger.events())
    base = next((e for e in events if isinstance(e, BaselineMeasured)), None)
    fin = next((e for e in reversed(events) if isinstance(e, RunFinished)), None)
    table = Table(title=f"ledger {ledger.path.parent.name}")
    for col in ("candidate", "pattern", "level", "source", "decision", "speedup (95% CI)", "reason"):
        table.add_column(col, overflow="fold")
    for c in ledger.candidates():
        colour = {"accepted": "green", "rejected": "yellow"}.get(c.decision, "white")
        sp = f"{c.speedup:.3f} ({c.ci_low:.3f}-{c.ci_high:.3f})" if c.speedup is not None else "-"
        table.add_row(c.candidate_id, c.pattern, c.level, c.source, f"[{colour}]{c.decision}[/{colour}]", sp,
                      c.reason[:160])
    console.print(table)
    if base:
        console.print(f"baseline: median step {base.median_ms:.1f} ms, verdict {base.verdict}, "
                      f"A/A false-accept rate {base.aa.false_accept_rate}")
    if fin and fin.final_speedup is not None:
        lo, hi = fin.final_ci or (None, None)
        console.print(f"final vs port: [bold]{fin.final_speedup:.3f}x[/bold] (95% CI {lo:.3f}-{hi:.3f})"
                      + (f"; torch.compile of the port: {fin.compiled_port_speedup:.3f}x" if fin.compiled_port_speedup else "")
                      + (f"; final vs compiled port: {fin.final_vs_compiled:.3f}x" if fin.final_vs_compiled else ""))
