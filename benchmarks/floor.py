"""Each workload's step against its floor on this machine (issue 22).

    python benchmarks/floor.py [--only nanogpt,llama] [--run nanogpt=runs/<id>] [--out benchmarks/results]

For each workload's port (and, with `--run NAME=RUN_DIR`, that run's final program too): one
harness run with the manifest's timed steps, then the profile, op-count and FLOP-count steps;
the floor (`trainbridge/profile/floor.py`) replays the step's matrix calls at their own shapes
and times one add at the step's mean elementwise size. The table gives step / floor and the
time above the floor by category. The final program does the port's work (work conservation),
so it is also set against the port's floor: at the port's precision, that ratio is how far the
loop got toward the floor (a lower precision moves the floor, and its own floor is shown).

Step and floor are measured in the same process tree one after the other, on this CPU; run it
on an otherwise idle machine. Results go to `benchmarks/results/floor.{md,json}`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainbridge.agent.programs import read_program  # noqa: E402
from trainbridge.harness.runner import port_sources, run_workload  # noqa: E402
from trainbridge.measure.timing import timing_kwargs  # noqa: E402
from trainbridge.profile.analysis import analyse  # noqa: E402
from trainbridge.profile.floor import floor_request, measure_floor, summarise  # noqa: E402
from trainbridge.targets.capabilities import cpu_signature  # noqa: E402
from trainbridge.workload import load_workload  # noqa: E402

WORKLOADS = ("nanogpt", "llama", "cifar_resnet", "clip")


def measure(name: str, files: dict[str, str], work: Path) -> dict:
    wl = load_workload(ROOT / "workloads" / name)
    r = run_workload(wl, "cpu", out_dir=work, label=name, sources=files, seed=1337, profile_steps=3,
                     count_ops=True, count_flops=True, **timing_kwargs(wl))
    if r.status != "ok":
        raise RuntimeError(f"{name}: {r.status}: {r.error}")
    prof = analyse(r, name)
    floor = measure_floor(floor_request(r, "cpu"), work / f"{name}-floor")
    step = statistics.median(r.measured_ms)
    s = summarise(floor, step_ms=step, op_ms_by_kind=prof.op_ms_by_kind(), outside_ms=prof.outside_ops_ms_per_step)
    return {"summary": s.model_dump(), "kernels": len(floor.kernels), "skipped": floor.skipped,
            "bench_s": floor.bench_s, "ns_per_element": floor.elementwise_ns_per_element,
            "probe_elements": floor.elementwise_probe_elements, "step_ms_raw": r.measured_ms,
            "verdict": prof.verdict}


def table(rows: list[dict]) -> str:
    out = ["| program | step | floor (matrix + elementwise) | step / floor | above the floor (ms): matrix, "
           "elementwise, other ops, outside ops | final against the port's floor |",
           "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        s = row["summary"]
        a = s["above_floor_ms"]
        vs_port = row.get("vs_port_floor")
        out.append(f"| {row['program']} | {s['step_ms']:.1f} ms | {s['floor_ms']:.1f} ms ({s['matrix_ms']:.1f} + "
                   f"{s['elementwise_ms']:.1f}) | **{s['step_over_floor']:.2f}x** | {a['matrix']:+.1f}, "
                   f"{a['elementwise']:+.1f}, {a['other operators']:+.1f}, {a['outside operators']:+.1f} | "
                   f"{f'{vs_port:.2f}x' if vs_port else '-'} |")
    out += ["", f"Machine: {cpu_signature()}. Floor: the step's matrix calls replayed alone at their shapes, "
            "plus its elementwise elements at one add's rate (one pass per op: fusion can go below that part)."]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--run", action="append", default=[], metavar="NAME=RUN_DIR",
                    help="also measure that run's final program (and its port, from the run folder)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    a = ap.parse_args()
    runs = dict(x.split("=", 1) for x in a.run)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in a.only.split(","):
            run_dir = Path(runs[name]) if name in runs else None
            port = read_program(run_dir / "port") if run_dir else port_sources(load_workload(
                ROOT / "workloads" / name), "cpu")[0]
            row = {"program": f"{name} port", **measure(name, port, work)}
            rows.append(row)
            print(table([row]).splitlines()[2], flush=True)
            if run_dir is not None:
                final = {"program": f"{name} final ({run_dir.name})", **measure(name, read_program(run_dir / "final"),
                                                                                 work)}
                final["vs_port_floor"] = final["summary"]["step_ms"] / row["summary"]["floor_ms"]
                rows.append(final)
                print(table([final]).splitlines()[2], flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "floor.json").write_text(json.dumps({"cpu": cpu_signature(), "rows": rows}, indent=1))
    (a.out / "floor.md").write_text(table(rows) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
