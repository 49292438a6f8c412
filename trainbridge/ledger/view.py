"""`trainbridge ledger runs/<id>`: accepted and rejected candidates as a table.

Cells are `rich.text.Text`, never markup: a reason such as "CI [0.98, 1.04]" or text an
LLM wrote must show as written.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .models import BaselineMeasured, RunFinished, RunStarted, VerifyResult
from .store import CandidateSummary, Ledger
from .summary import evidence_event, evidence_line

_STYLE = {"accepted": "green", "rejected": "red", "pending": "yellow", "validated_not_measured": "cyan"}


def _speedup(c: CandidateSummary) -> str:
    if c.speedup is None:
        return "-"
    ci = f" [{c.ci_low:.3f}, {c.ci_high:.3f}]" if c.ci else ""
    return f"{c.speedup:.3f}x{ci}" + (" (suspicious)" if c.suspicious else "")


def candidates_table(ledger: Ledger, title: str | None = None) -> Table:
    table = Table(title=title or f"ledger {ledger.path.parent.name}")
    for col in ("candidate", "intent / pattern", "level", "decision", "speedup [CI]", "reason"):
        table.add_column(col, overflow="fold")
    for c in ledger.candidates():
        table.add_row(
            Text(c.candidate_id), Text(f"{c.intent_id or '-'} / {c.pattern}"), Text(c.level),
            Text(c.decision, style=_STYLE[c.decision]), Text(_speedup(c)), Text(c.reason[:200]),
        )
    return table


def render_ledger(ledger: Ledger, console: Console) -> Table:
    """Print the candidates table and the run's baseline, final and verify lines."""
    events = ledger.events()
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    base = next((e for e in reversed(events) if isinstance(e, BaselineMeasured)), None)
    fin = next((e for e in reversed(events) if isinstance(e, RunFinished)), None)
    ver = next((e for e in reversed(events) if isinstance(e, VerifyResult)), None)
    title = f"ledger {started.run_id} ({started.target})" if started else None
    table = candidates_table(ledger, title)
    console.print(table)
    if base is not None:
        median = base.median_ms if base.median_ms is not None else (base.summary.median_ms if base.summary else None)
        line = f"baseline: median step {median:.2f} ms" if median is not None else "baseline: no step times"
        line += f" over {len(base.runs_ms)} runs"
        if base.verdict:
            line += f", verdict {base.verdict}"
        if base.aa is not None:
            line += f"; A/A false-accept rate {base.aa.false_accept_rate:.3f} over {base.aa.n_splits} splits"
        console.print(Text(line))
    evidence = evidence_event(events)
    if evidence is not None:
        console.print(Text(evidence_line(evidence), style="bold red" if evidence.missing else ""))
    if fin is not None:
        if fin.final_speedup is not None:
            ci = f" [{fin.final_ci[0]:.3f}, {fin.final_ci[1]:.3f}]" if fin.final_ci else ""
            line = f"final vs port: {fin.final_speedup:.3f}x{ci}"
        else:
            line = "final vs port: not measured"
        if fin.compiled_port_speedup is not None:
            line += f"; torch.compile of the port: {fin.compiled_port_speedup:.3f}x"
        if fin.final_vs_compiled is not None:
            line += f"; final vs compiled port: {fin.final_vs_compiled:.3f}x"
        line += f"; accepted {len(fin.accepted)}, rejected {len(fin.rejected)}"
        console.print(Text(line, style="bold"))
    if ver is not None:
        measured = (f"measured {ver.measured_speedup:.3f}x [{ver.ci[0]:.3f}, {ver.ci[1]:.3f}]"
                    if ver.measured_speedup is not None and ver.ci else "; ".join(ver.problems) or "not measured")
        console.print(Text(f"verify: {measured} -> " + ("holds" if ver.holds else "does not hold"),
                           style="green" if ver.holds else "red"))
    return table
