"""`trainbridge runs`: the run folders under a runs root, a line each.

A folder counts as a run when it holds a `ledger.jsonl`. A ledger that cannot be read (a
damaged line) is listed with the reason instead of being skipped: a run must not vanish
from the list because its ledger needs `--salvage`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from .models import RunFinished, RunStarted
from .store import Ledger, LedgerError
from .summary import verdict_line


class RunEntry(BaseModel):
    run_dir: str
    run_id: str | None = None
    started_utc: str | None = None
    workload: str | None = None
    target: str | None = None
    finished: bool = False
    accepted: int = 0
    rejected: int = 0
    final_speedup: float | None = None
    final_ci: tuple[float, float] | None = None
    verdict: str = ""


def list_runs(root: Path) -> list[RunEntry]:
    """Runs under `root` (its direct sub-folders with a ledger), oldest first."""
    out = []
    for ledger_path in sorted(Path(root).glob("*/ledger.jsonl")):
        run_dir = ledger_path.parent
        try:
            events = Ledger(ledger_path).events()
        except LedgerError as e:
            out.append(RunEntry(run_dir=str(run_dir), verdict=f"ledger unreadable: {e}"))
            continue
        started = next((e for e in events if isinstance(e, RunStarted)), None)
        fin = next((e for e in reversed(events) if isinstance(e, RunFinished)), None)
        out.append(RunEntry(
            run_dir=str(run_dir), run_id=started.run_id if started else None,
            started_utc=started.time_utc if started else None,
            workload=(started.workload_name or Path(started.workload).name) if started else None,
            target=started.target if started else None, finished=fin is not None,
            accepted=len(fin.accepted) if fin else 0, rejected=len(fin.rejected) if fin else 0,
            final_speedup=fin.final_speedup if fin else None, final_ci=fin.final_ci if fin else None,
            verdict=verdict_line(fin)))
    return sorted(out, key=lambda r: (r.started_utc or "", r.run_dir))
