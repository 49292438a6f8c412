"""`trainbridge records extract PATH`: find every record under a Modded-NanoGPT checkout or
a folder of its logs, with its script, extra files and GPU reference timings.

A log belongs to the nearest folder named like a record (`YYYY-MM-DD_Name`, or the older
`MMDDYY_Name`); logs under a `baseline/` folder are the comparison run of a PR, not the
record, and are skipped. Folders are matched to the README table shipped beside this
module (known_records.tsv) by name and date, which gives the record number.
"""

from __future__ import annotations

import csv
import datetime as dt
import re
from functools import lru_cache
from pathlib import Path

from .logs import median_or_none, read_log
from .models import KnownRecord, RecordEntry, RecordIndex

LOG_SUFFIXES = (".txt", ".log")
_NEW = re.compile(r"^(\d{4})-(\d{2})-(\d{2})_(.+)$")
_OLD = re.compile(r"^(\d{2})(\d{2})(\d{2})_(.+)$")
_SKIP_DIRS = {"baseline", ".git", "__pycache__"}


class ExtractError(ValueError):
    """The path holds nothing to extract; the message says what was looked for."""


def parse_record_folder(name: str) -> tuple[str | None, str] | None:
    """(ISO date, name) of a record folder name, or None if it is not one."""
    if m := _NEW.match(name):
        return f"{m[1]}-{m[2]}-{m[3]}", m[4]
    if m := _OLD.match(name):
        try:
            return dt.date(2000 + int(m[3]), int(m[1]), int(m[2])).isoformat(), m[4]
        except ValueError:
            return None
    return None


@lru_cache(maxsize=1)
def known_records() -> tuple[KnownRecord, ...]:
    path = Path(__file__).with_name("known_records.tsv")
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    return tuple(KnownRecord(num=int(r["num"]), record_time=r["record_time"], date=r["date"],
                             description=r["description"], log_link=r["log_link"] or "") for r in rows)


def _known_folder(rec: KnownRecord) -> str | None:
    for part in reversed(Path(rec.log_link).parts):
        if parse_record_folder(part):
            return part
    return None


def match_known(folder: str) -> KnownRecord | None:
    """The README-table row of a record folder: exact folder name, else same name and date."""
    parsed = parse_record_folder(folder)
    by_folder = {_known_folder(r): r for r in known_records() if _known_folder(r)}
    if folder in by_folder:
        return by_folder[folder]
    if not parsed:
        return None
    date, name = parsed
    same_name = [r for f, r in by_folder.items() if parse_record_folder(f)[1].lower() == name.lower()]
    dated = [r for r in same_name if date and abs((dt.date.fromisoformat(date) - dt.date.fromisoformat(
        parse_record_folder(_known_folder(r))[0])).days) <= 7]
    pick = dated or same_name
    return pick[0] if len(pick) == 1 else None


def _record_folder(log: Path, root: Path) -> str:
    for parent in [log.parent, *log.parent.parents]:
        if parent == root.parent:
            break
        if parse_record_folder(parent.name):
            return parent.name
    return log.parent.name if log.parent != root else log.stem


def find_logs(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).parts
        if p.is_file() and p.suffix in LOG_SUFFIXES and not (_SKIP_DIRS & set(rel[:-1])) \
                and not p.name.lower().startswith("readme"):
            out.append(p)
    return out


def extract(path: Path) -> RecordIndex:
    """Every record under `path`, in record order (number, then date, then name)."""
    path = Path(path)
    if not path.exists():
        raise ExtractError(f"{path}: no such file or folder")
    logs = find_logs(path)
    groups: dict[str, list[Path]] = {}
    for log in logs:
        groups.setdefault(_record_folder(log, path), []).append(log)
    entries = []
    for key, files in groups.items():
        parsed = [read_log(f) for f in files]
        if not any(p.script or p.steps or p.final_val_loss is not None for p in parsed):
            continue  # not a record log (a notes file, a requirements list ...)
        entries.append(_entry(key, parsed))
    if (path / "records").is_dir():  # a checkout: list the table's records that have no log at all
        found = {e.num for e in entries}
        for rec in known_records():
            if not rec.log_link and rec.num not in found:
                entries.append(RecordEntry(key=f"record-{rec.num}", num=rec.num, name=rec.description,
                                           description=rec.description, readme_time=rec.record_time,
                                           no_script_reason="the record has no log in the repository"))
    if not entries:
        raise ExtractError(f"{path}: no record logs found (looked for *.txt / *.log files with `step:` "
                           f"lines or an embedded script)")
    entries.sort(key=lambda e: (e.num if e.num is not None else 10**6, e.date or "", e.key))
    return RecordIndex(source=str(path), records=entries)


def _entry(key: str, parsed) -> RecordEntry:
    known = match_known(key)
    folder = parse_record_folder(key)
    with_script = [p for p in parsed if p.script]
    main = next((p for p in with_script if p.script_parses), with_script[0] if with_script else None)
    entry = RecordEntry(
        key=key, num=known.num if known else None, name=folder[1] if folder else key,
        date=folder[0] if folder else None, description=known.description if known else "",
        readme_time=known.record_time if known else None, logs=parsed,
        reference_train_time_ms=median_or_none([p.final_train_time_ms for p in parsed]),
        reference_step_avg_ms=median_or_none([p.final_step_avg_ms for p in parsed]),
        reference_val_loss=median_or_none([p.final_val_loss for p in parsed]),
    )
    if main is None:
        entry.no_script_reason = ("the log embeds no Python script (an llm.c log)" if parsed
                                  else "no log")
    else:
        entry.script, entry.extra_files, entry.script_log = main.script, main.extra_files, main.path
    return entry
