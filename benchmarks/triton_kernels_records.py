"""Port the Triton/NVRTC kernels of every Modded-NanoGPT record that has them; report coverage.

    python benchmarks/triton_kernels_records.py RECORDS_JSON [--cache DIR] [--naive-first] [--out FILE]

RECORDS_JSON is `trainbridge records extract`'s index (each record's script and extra files).
Nothing is trained: each record goes through `targets.features.triton_kernels.port` (with the
kernel checks, cached in DIR), one record at a time. Prints one line per record and writes the
per-record launchers, checks and blockers as JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from trainbridge.targets.features.triton_kernels import port
from trainbridge.targets.kernels.scan import scan_program
from trainbridge.targets.port_source import port_naive


def _files(record: dict) -> dict[str, str]:
    return {"train_gpt.py": record.get("script") or "", **(record.get("extra_files") or {})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("records")
    ap.add_argument("--cache", default="runs/kernel-checks")
    ap.add_argument("--naive-first", action="store_true", help="port the naive port's output, as port_program does")
    ap.add_argument("--out", default="triton_kernels_records.json")
    args = ap.parse_args()
    index = json.loads(Path(args.records).read_text())
    rows = []
    for rec in index["records"]:
        files = _files(rec)
        scan = scan_program(files)
        if scan.empty:
            continue
        if args.naive_first:
            files = port_naive(files, "cpu").files
        started = time.time()
        res = port(files, "cpu", cache_dir=args.cache)
        left = [f for f, t in res.files.items() if re.search(r"^\s*(import triton\b|from triton\b|@triton\.)", t, re.M)
                or "_compile_kernel(" in t]
        replaced = [{"file": c.file, "launcher": c.before, "note": c.note} for c in res.changes
                    if c.kind == "kernel_replaced" and "check " in c.note]
        row = {"num": rec.get("num"), "key": rec["key"], "kernels": len(scan.kernels), "nvrtc": len(scan.nvrtc),
               "launchers": len(scan.launchers), "replaced": replaced,
               "blockers": [b.model_dump() for b in res.blockers], "triton_left_in": left,
               "seconds": round(time.time() - started, 1)}
        rows.append(row)
        print(f"{rec.get('num')!s:>4} {rec['key'][:40]:40} kernels {row['kernels']:2} nvrtc {row['nvrtc']} "
              f"launchers {row['launchers']:2} replaced {len(replaced):2} blockers {len(res.blockers):2} "
              f"triton left {left or '-'} {row['seconds']:6.1f}s", flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
