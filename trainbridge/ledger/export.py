"""A run's candidates as CSV or JSON, for a spreadsheet or another tool.

One row per candidate (`store.CandidateSummary`, the fields `ledger show` folds from the
events), with the run's id, workload and target on every row so exports of several runs
can be concatenated. The raw step times stay in the ledger; the export points there.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Literal

from .models import RunStarted
from .store import CandidateSummary, Ledger

ExportFormat = Literal["csv", "json"]

RUN_FIELDS = ("run_id", "workload", "target")
CANDIDATE_FIELDS = tuple(CandidateSummary.model_fields)


def export_rows(run_dir: Path) -> list[dict]:
    """Every candidate of the run as a flat dict: the run's fields, then the candidate's."""
    ledger = Ledger(Path(run_dir) / "ledger.jsonl")
    started = next((e for e in ledger.events() if isinstance(e, RunStarted)), None)
    run = {"run_id": started.run_id if started else None,
           "workload": (started.workload_name or Path(started.workload).name) if started else None,
           "target": started.target if started else None}
    return [{**run, **c.model_dump()} for c in ledger.candidates()]


def export_text(run_dir: Path, fmt: ExportFormat) -> str:
    rows = export_rows(run_dir)
    if fmt == "json":
        return json.dumps(rows, indent=1) + "\n"
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[*RUN_FIELDS, *CANDIDATE_FIELDS], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
