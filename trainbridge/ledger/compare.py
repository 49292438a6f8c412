"""Two runs of one workload side by side: which accepted what, and their end-to-end figures.

Runs are compared by mechanism, not by candidate id: `c03-sdpa_attention` in one run and
`c05-sdpa_attention` in another tried the same change, so the id's `cNN-` counter (and a
repair's `-rN` suffix) is dropped to make the row key. A mechanism one run tried and the
other did not shows `-` on that side.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, Field

from .models import RunFinished, RunStarted
from .store import CandidateSummary, Ledger
from .summary import verdict_line

_COUNTER = re.compile(r"^c\d+-")
_REPAIR = re.compile(r"-r\d+$")


def mechanism_key(candidate_id: str) -> str:
    """`c03-sdpa_attention-r1` -> `sdpa_attention`: what was tried, whatever its place in the run."""
    return _REPAIR.sub("", _COUNTER.sub("", candidate_id))


class RunSide(BaseModel):
    """One run as the comparison shows it."""

    run_dir: str
    run_id: str | None = None
    workload_name: str | None = None
    target: str | None = None
    verdict: str
    final_speedup: float | None = None
    final_ci: tuple[float, float] | None = None
    accepted: list[str] = Field(default_factory=list)


class MechanismRow(BaseModel):
    """One mechanism across the two runs: the candidate each tried for it (None: not tried)."""

    mechanism: str
    a: CandidateSummary | None = None
    b: CandidateSummary | None = None

    @property
    def agree(self) -> bool:
        return (self.a is not None and self.b is not None) and self.a.decision == self.b.decision


class RunComparison(BaseModel):
    a: RunSide
    b: RunSide
    rows: list[MechanismRow]


class NotComparable(ValueError):
    """The two folders are not two runs of one workload."""


def _side(run_dir: Path, ledger: Ledger) -> RunSide:
    events = ledger.events()
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    fin = next((e for e in reversed(events) if isinstance(e, RunFinished)), None)
    return RunSide(run_dir=str(run_dir), run_id=started.run_id if started else None,
                   workload_name=(started.workload_name or Path(started.workload).name) if started else None,
                   target=started.target if started else None, verdict=verdict_line(fin),
                   final_speedup=fin.final_speedup if fin else None, final_ci=fin.final_ci if fin else None,
                   accepted=list(fin.accepted) if fin else [])


def _last_per_mechanism(cands: list[CandidateSummary]) -> dict[str, CandidateSummary]:
    """A repaired candidate's last attempt speaks for its mechanism."""
    out: dict[str, CandidateSummary] = {}
    for c in cands:
        out[mechanism_key(c.candidate_id)] = c
    return out


def compare_runs(run_a: Path, run_b: Path) -> RunComparison:
    """The two runs' verdicts and a row per mechanism either tried. Raises NotComparable when
    the runs are of different workloads or targets (their figures would not be comparable)."""
    la, lb = Ledger(Path(run_a) / "ledger.jsonl"), Ledger(Path(run_b) / "ledger.jsonl")
    a, b = _side(Path(run_a), la), _side(Path(run_b), lb)
    if a.workload_name != b.workload_name:
        raise NotComparable(f"{run_a} is a run of {a.workload_name!r}, {run_b} of {b.workload_name!r}: "
                            "compare two runs of one workload")
    if a.target != b.target:
        raise NotComparable(f"{run_a} ran on {a.target}, {run_b} on {b.target}: compare runs on one target")
    ma, mb = _last_per_mechanism(la.candidates()), _last_per_mechanism(lb.candidates())
    keys = list(ma) + [k for k in mb if k not in ma]
    return RunComparison(a=a, b=b, rows=[MechanismRow(mechanism=k, a=ma.get(k), b=mb.get(k)) for k in keys])
