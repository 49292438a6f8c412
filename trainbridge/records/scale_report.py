"""The scale override over a whole extraction: one row per record, what was set, problems.

    python -m trainbridge.records.scale_report records.json [--track 1] [--set KNOB=VALUE ...] [-o table.md]

Reads records.json (`trainbridge records extract`), scales every script with the CPU
defaults (and the `--set` knobs), runs the static check, and prints a markdown table: the
configuration each record got, how many sites were rewritten, the record's own asserts and
the invariants checked, the knobs its era has no place for, and every problem. Nothing runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from .models import RecordIndex
from .scale import CPU_DEFAULTS, KNOBS, ScaleError, scale_record

# knobs every record has a place for; the rest are era-specific (head_dim from record 31 on ...)
CORE_KNOBS = ("layers", "heads", "width", "steps", "train_files", "val_files", "val_tokens")


class ScaleRow(BaseModel):
    num: int | None
    key: str
    layers: int | None = None
    heads: int | None = None
    head_dim: int | None = None
    width: int | None = None
    tokens_per_step: int | None = None
    steps: int | None = None
    sites: int = Field(0, description="values rewritten")
    knobs: list[str] = Field(default_factory=list, description="knobs that matched a site")
    missing_core: list[str] = Field(default_factory=list, description="core knobs with no site in this record")
    asserts: int = 0
    invariants: int = 0
    notes: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)


def scale_rows(index: RecordIndex, overrides: dict[str, object] | None = None, *,
               track: int | None = 1) -> list[ScaleRow]:
    rows = []
    for e in index.records:
        if not e.script or (track is not None and e.track not in (track, None)):
            continue
        row = ScaleRow(num=e.num, key=e.key)
        try:
            r = scale_record(e.script, overrides, shards=Path("/shards"), companions=e.extra_files)
        except ScaleError as err:
            row.problems = [str(err)]
            rows.append(row)
            continue
        c = r.config
        names = set(r.applied)
        knobs = sorted(k for k, ns in KNOBS.items() if names & set(ns))
        row = ScaleRow(num=e.num, key=e.key, layers=c.get("layers"), heads=c.get("heads"), head_dim=c.get("head_dim"),
                       width=c.get("width"), tokens_per_step=r.tokens_per_step, steps=c.get("steps"),
                       sites=sum(len(w) for w in r.applied.values()), knobs=knobs,
                       missing_core=[k for k in CORE_KNOBS if k not in knobs], asserts=r.asserts_checked,
                       invariants=r.invariants_checked, notes=r.notes, problems=r.problems)
        rows.append(row)
    return rows


def table_md(rows: list[ScaleRow]) -> str:
    out = ["| record | folder | layers | heads x head_dim = width | tokens/step | steps | sites | asserts | "
           "invariants | core knobs without a site | problems |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        kept = " (kept)" if any("layers kept" in n for n in r.notes) else ""
        out.append(f"| {r.num if r.num is not None else '?'} | {r.key} | {r.layers}{kept} | "
                   f"{r.heads} x {r.head_dim} = {r.width} | {r.tokens_per_step} | {r.steps} | {r.sites} | "
                   f"{r.asserts} | {r.invariants} | {', '.join(r.missing_core) or '-'} | "
                   f"{'; '.join(p.replace('|', '/') for p in r.problems) or '-'} |")
    clean = sum(not r.problems for r in rows)
    out.append(f"\n{clean} of {len(rows)} scripts scale with no problem.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", type=Path, help="records.json from `trainbridge records extract`")
    p.add_argument("--track", type=int, default=1, help="only this track (0: all)")
    p.add_argument("--set", dest="sets", action="append", default=[], help="KNOB=VALUE or FIELD=VALUE")
    p.add_argument("-o", "--out", type=Path, help="write the table here as well")
    a = p.parse_args(argv)
    overrides: dict[str, object] = {}
    for item in a.sets:
        key, _, value = item.partition("=")
        try:
            overrides[key] = int(value)
        except ValueError:
            try:
                overrides[key] = float(value)
            except ValueError:
                overrides[key] = value
    index = RecordIndex.model_validate_json(a.records.read_text())
    text = table_md(scale_rows(index, overrides, track=a.track or None))
    print(text)
    if a.out:
        a.out.write_text(f"Scale override with {CPU_DEFAULTS | overrides}:\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
