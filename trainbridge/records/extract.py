"""`trainbridge records extract PATH`: find every record under a Modded-NanoGPT checkout or
a folder of its logs, with its script, extra files and GPU reference timings.

Layouts this has to read (all seen in the public repository):

- record folders `YYYY-MM-DD_Name`, `YYYY-MM-DD-Name` (a dash after the date),
  `MMDDYY_Name` (before Oct 2025) and `YYYYMMDD_Name` (the optimization track's results);
  the folder is the child of `records/track_N_*` (or of `records/` in the old layout);
- log file names that look like a dated folder themselves
  (`2026-02-16_21-30-05_time-362_secs_....txt`): only folders name records;
- a record folder with several subfolders: the PR's comparison run (`baseline/`,
  `xsa-baseline-s1335/`, `baseline_retime/`, `prior/`, `master-s1480/`, files named
  `baseline0-1480.txt` or `comparison_<uuid>.txt`), which is skipped, and one or more
  variants of the record (`this_pr_v1`..`v3`, `record/`, `pr233/`). The script and the
  timings come from one variant: the one the README table's log link points into, else the
  newest (highest `_vN`, then latest timestamp in its log names, then last by name);
- tracks 2 and 3 (`track_2_medium`, `track_3_optimization`): listed with their track and
  never given a track-1 number.

Folders are matched to the README table shipped beside this module (known_records.tsv) by
folder name, then by name and date within a week, which gives the record number. A folder
that only shares its name with a record whose own README folder is also present (a re-run,
a copy) gets no number, and says so in its `note`.
"""

from __future__ import annotations

import csv
import datetime as dt
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .logs import median_or_none, read_log
from .models import KnownRecord, ParsedLog, RecordEntry, RecordIndex

LOG_SUFFIXES = (".txt", ".log")
_NEW = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[_-](.+)$")
_OLD = re.compile(r"^(\d{2})(\d{2})(\d{2})_(.+)$")
_COMPACT = re.compile(r"^(20\d{2})(\d{2})(\d{2})_(.+)$")
_TRACK = re.compile(r"^track_(\d+)(?:_|$)")
_SKIP_DIRS = {".git", "__pycache__"}
# a path part below the record folder that marks the PR's comparison run, not the record
_BASELINE = re.compile(r"(?i)baseline|^comparison|^master(?:$|[-_])|^prior$")
_VERSION = re.compile(r"(?i)(?:^|[-_])v(\d+)(?:$|[-_])")
_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})")
_WEEK = 7


class ExtractError(ValueError):
    """The path holds nothing to extract; the message says what was looked for."""


def _date(y: int, m: int, d: int) -> str | None:
    try:
        return dt.date(y, m, d).isoformat()
    except ValueError:
        return None


def parse_record_folder(name: str) -> tuple[str | None, str] | None:
    """(ISO date, name) of a record folder name, or None if it is not one."""
    if m := _NEW.match(name):
        date = _date(int(m[1]), int(m[2]), int(m[3]))
        return (date, m[4]) if date else None
    if m := _COMPACT.match(name):
        date = _date(int(m[1]), int(m[2]), int(m[3]))
        return (date, m[4]) if date else None
    if m := _OLD.match(name):
        date = _date(2000 + int(m[3]), int(m[1]), int(m[2]))
        return (date, m[4]) if date else None
    return None


def track_of(path: Path) -> int | None:
    """The track a path lies in: `records/track_N_*` -> N, `records/<record folder>` -> 1."""
    parts = Path(path).resolve().parts
    for part in parts:
        if m := _TRACK.match(part):
            return int(m[1])
    for i, part in enumerate(parts[:-1]):
        if part == "records" and parse_record_folder(parts[i + 1]):
            return 1  # the layout before tracks had folders: only the short track existed
    return None


@lru_cache(maxsize=1)
def known_records() -> tuple[KnownRecord, ...]:
    path = Path(__file__).with_name("known_records.tsv")
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    return tuple(KnownRecord(num=int(r["num"]), record_time=r["record_time"], date=r["date"],
                             description=r["description"], log_link=r["log_link"] or "") for r in rows)


def _link_split(rec: KnownRecord) -> tuple[str, tuple[str, ...]] | None:
    """(record folder, the link's parts below it) of a README log link.

    The folder is the child of `records/track_N_*` (or of `records/`); a log file name
    that looks like a dated folder (`2026-02-16_21-30-05_time-...txt`) is never taken.
    """
    parts = Path(rec.log_link).parts
    if not parts:
        return None
    if parts[0] == "records" and len(parts) > 1:
        i = 2 if _TRACK.match(parts[1]) else 1
        if i < len(parts) and parse_record_folder(parts[i]):
            return parts[i], parts[i + 1:]
    dirs = parts[:-1] if parts[-1].endswith(LOG_SUFFIXES) else parts
    for i in range(len(dirs) - 1, -1, -1):
        if parse_record_folder(dirs[i]):
            return dirs[i], parts[i + 1:]
    return None


@dataclass(frozen=True)
class Match:
    record: KnownRecord
    how: str  # "folder" | "name and date" | "name"
    link_below: tuple[str, ...]  # the README link's path below the record folder


def _match(folder: str, track: int | None = None) -> Match | None:
    if track not in (None, 1):
        return None  # the README table is the short track's
    links = {}
    for r in known_records():
        if split := _link_split(r):
            links.setdefault(split[0], (r, split[1]))
    if folder in links:
        return Match(links[folder][0], "folder", links[folder][1])
    parsed = parse_record_folder(folder)
    if not parsed:
        return None
    date, name = parsed
    same = [(f, r) for f, (r, _) in links.items() if parse_record_folder(f)[1].lower() == name.lower()]
    near = [(f, r) for f, r in same if date and abs(
        (dt.date.fromisoformat(date) - dt.date.fromisoformat(parse_record_folder(f)[0])).days) <= _WEEK]
    if len(near) == 1:
        return Match(near[0][1], "name and date", ())
    if not near and len(same) == 1:
        return Match(same[0][1], "name", ())
    return None


def match_known(folder: str, track: int | None = None) -> KnownRecord | None:
    """The README-table row of a record folder: exact folder name, else same name and date."""
    m = _match(folder, track)
    return m.record if m else None


def _record_dir(log: Path, root: Path) -> Path:
    """The outermost folder named like a record between `root` (included) and the log."""
    below = [log.parent, *log.parent.parents]
    below = below[: below.index(root) + 1] if root in below else [log.parent]
    named = [p for p in below if parse_record_folder(p.name)]
    if named:
        return named[-1]
    return log.parent


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


def is_baseline(log: Path, record_dir: Path) -> bool:
    """Whether a log is the PR's comparison run (by a folder or file name below the record)."""
    rel = log.relative_to(record_dir).parts if log.is_relative_to(record_dir) else (log.name,)
    return any(_BASELINE.search(part) for part in (*rel[:-1], Path(rel[-1]).stem))


def _variant_of(log: Path, record_dir: Path) -> str:
    rel = log.relative_to(record_dir).parts
    return rel[0] if len(rel) > 1 else ""


def _newest(variants: list[str], logs: dict[str, list[Path]]) -> str:
    def key(v: str):
        version = _VERSION.search(v)
        stamps = [m[1] for p in logs[v] if (m := _STAMP.search(p.name))]
        return (int(version[1]) if version else -1, max(stamps, default=""), v)
    return max(variants, key=key)


def extract(path: Path) -> RecordIndex:
    """Every record under `path`, in record order (number, then date, then name)."""
    path = Path(path)
    if not path.exists():
        raise ExtractError(f"{path}: no such file or folder")
    root = path.resolve()
    logs = [p.resolve() for p in find_logs(root)]
    groups: dict[Path, list[Path]] = {}
    for log in logs:
        groups.setdefault(_record_dir(log, root) if root.is_dir() else log.parent, []).append(log)
    # keys are folder names; where two folders share one, the short track's keeps it
    short: dict[str, list[Path]] = {}
    names: dict[str, int] = {}
    for folder in groups:
        names[folder.name] = names.get(folder.name, 0) + 1
        if track_of(folder) in (1, None):
            short.setdefault(folder.name, []).append(folder)
    entries: list[tuple[RecordEntry, Match | None]] = []
    for folder, files in groups.items():
        plain = names[folder.name] == 1 or short.get(folder.name) == [folder]
        key = folder.name if plain else _unique_key(folder, root)
        built = _entry(key, folder, files)
        if built is not None:
            entries.append(built)
    _unnumber_copies(entries)
    records = [e for e, _ in entries]
    if (root / "records").is_dir():  # a checkout: list the table's records that have no log at all
        found = {e.num for e in records}
        for rec in known_records():
            if not rec.log_link and rec.num not in found:
                records.append(RecordEntry(key=f"record-{rec.num}", num=rec.num, track=1, name=rec.description,
                                           description=rec.description, readme_time=rec.record_time,
                                           no_script_reason="the record has no log in the repository"))
    if not records:
        raise ExtractError(f"{path}: no record logs found (looked for *.txt / *.log files with `step:` "
                           f"lines or an embedded script)")
    records.sort(key=lambda e: (e.num if e.num is not None else 10**6, e.track or 0, e.date or "", e.key))
    return RecordIndex(source=str(path), records=records)


def _unique_key(folder: Path, root: Path) -> str:
    try:
        return folder.relative_to(root).as_posix() or folder.name
    except ValueError:
        return folder.as_posix()


def _unnumber_copies(entries: list[tuple[RecordEntry, Match | None]]) -> None:
    """A folder matched only by name loses its number when the record's README folder is here."""
    exact = {m.record.num: e.key for e, m in entries if m and m.how == "folder"}
    for e, m in entries:
        if m and m.how != "folder" and m.record.num in exact:
            e.note = (f"same name as record {m.record.num}, whose README log is in {exact[m.record.num]} "
                      f"(also extracted): a re-run or copy, left unnumbered")
            e.num, e.readme_time, e.description = None, None, ""


def _entry(key: str, folder: Path, files: list[Path]) -> tuple[RecordEntry, Match | None] | None:
    track = track_of(folder)
    match = _match(folder.name, track)
    known = match.record if match else None
    parsed_name = parse_record_folder(folder.name)
    baseline = [f for f in files if is_baseline(f, folder)]
    by_variant: dict[str, list[Path]] = {}
    for f in files:
        if f not in baseline:
            by_variant.setdefault(_variant_of(f, folder), []).append(f)
    parsed = {f: read_log(f) for fs in by_variant.values() for f in fs}
    if not any(p.script or p.steps or p.final_val_loss is not None for p in parsed.values()):
        return None  # not a record log (a notes file, a requirements list ...)
    variant, reason, linked = _choose_variant(by_variant, parsed, folder, match)
    chosen = [parsed[f] for f in by_variant[variant]]
    entry = RecordEntry(
        key=key, num=known.num if known else None, track=track,
        name=parsed_name[1] if parsed_name else key, date=parsed_name[0] if parsed_name else None,
        description=known.description if known else "", readme_time=known.record_time if known else None,
        logs=chosen, variant=variant or None, variant_reason=reason,
        other_variants={v: len(fs) for v, fs in sorted(by_variant.items()) if v != variant},
        baseline_logs=len(baseline),
        reference_train_time_ms=median_or_none([p.final_train_time_ms for p in chosen]),
        reference_step_avg_ms=median_or_none([p.final_step_avg_ms for p in chosen]),
        reference_val_loss=median_or_none([p.final_val_loss for p in chosen]),
    )
    if match and match.how != "folder":
        entry.note = f"matched to the README table by {match.how}"
    with_script = [p for p in chosen if p.script]
    main = linked if linked is not None and linked.script else \
        next((p for p in with_script if p.script_parses), with_script[0] if with_script else None)
    if main is None:
        entry.no_script_reason = ("the log embeds no Python script (an llm.c log)" if chosen else "no log")
    else:
        entry.script, entry.extra_files, entry.script_log = main.script, main.extra_files, main.path
    entry.logs = [log.compact() for log in chosen]
    return entry, match


def _choose_variant(by_variant: dict[str, list[Path]], parsed: dict[Path, ParsedLog], folder: Path,
                    match: Match | None) -> tuple[str, str, ParsedLog | None]:
    """(variant, why, the linked log if it is here) for one record folder."""
    below = match.link_below if match else ()
    if below:
        linked_path = folder.joinpath(*below)
        want = below[0] if len(below) > 1 or not below[-1].endswith(LOG_SUFFIXES) else ""
        if want in by_variant:
            linked = parsed.get(linked_path)
            where = f"{want}/" if want else "the record folder"
            return want, f"the README's log link points into {where}", linked
    scripted = [v for v, fs in by_variant.items() if any(parsed[f].script for f in fs)]
    candidates = scripted or list(by_variant)
    if len(candidates) == 1:
        only = candidates[0]
        return only, ("the only variant" if len(by_variant) == 1 else "the only variant with a script"), None
    pick = _newest(candidates, by_variant)
    shown = ", ".join(v or "." for v in sorted(candidates))
    return pick, f"the newest of {shown} (highest _vN, then latest log time stamp, then name)", None
