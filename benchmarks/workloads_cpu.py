"""The four-workload table: `trainbridge run` on each workload, one after the other.

    python benchmarks/workloads_cpu.py [--minutes 6] [--budget 8] [--only nanogpt,llama]
                                       [--runs-root runs] [--out benchmarks/results]
                                       [--reuse nanogpt=runs/<id>] [-- trainbridge run options]

For each workload: the loop (port, baseline, evidence, candidates) and its end-to-end
measurement, where the port, the final program and `torch.compile` of the port run
interleaved in one session. The table is built from each run folder's `end_to_end.json`
and ledger (with the latest `trainbridge ledger verify` of the run, when one was made);
raw samples stay there. Run it on an otherwise idle machine: the ratios are
measured within one session, but other load widens every interval.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainbridge.ledger import models as ev  # noqa: E402
from trainbridge.ledger.store import Ledger  # noqa: E402
from trainbridge.ledger.summary import evidence_event  # noqa: E402
from trainbridge.targets.capabilities import cpu_signature  # noqa: E402

WORKLOADS = ("nanogpt", "llama", "cifar_resnet", "clip")


def summarize(name: str, run_dir: Path) -> dict:
    e2e = json.loads((run_dir / "end_to_end.json").read_text())
    events = list(Ledger(run_dir / "ledger.jsonl").events())
    proposed = {e.candidate_id: e for e in events if isinstance(e, ev.CandidateProposed)}
    decided = [e for e in events if isinstance(e, ev.CandidateDecided)]
    accepted = [proposed[d.candidate_id].source.split(":", 1)[-1] for d in decided if d.decision == "accepted"]
    fvp, cvp = e2e.get("final_vs_port") or {}, e2e.get("compiled_port_vs_port") or {}
    verified = [e for e in events if isinstance(e, ev.VerifyResult)]  # `trainbridge ledger verify`, if run
    evidence = evidence_event(events)
    return {"workload": name, "run_dir": str(run_dir),
            "port_step_ms": fvp.get("median_incumbent_ms"), "final_step_ms": fvp.get("median_candidate_ms"),
            "speedup": fvp.get("speedup"), "ci": [fvp.get("ci_low"), fvp.get("ci_high")],
            "compiled_port_speedup": cvp.get("speedup"), "compiled_port_ci": [cvp.get("ci_low"), cvp.get("ci_high")],
            "runs_per_arm": fvp.get("n_runs_candidate"), "accepted": accepted,
            "rejected": sum(d.decision == "rejected" for d in decided),
            "gpu_intents": evidence.intents if evidence is not None and evidence.source != "skipped" else None,
            "evidence_missing": evidence.missing if evidence is not None else None,
            "verify": ({"speedup": verified[-1].measured_speedup, "ci": list(verified[-1].ci),
                        "runs_per_arm": len(verified[-1].final_runs_ms), "holds": verified[-1].holds}
                       if verified else None)}


def table(rows: list[dict]) -> str:
    out = ["| workload | GPU intents | port step | final step | final vs port (95% CI) | re-verified (runs/arm) "
           "| torch.compile(port) vs port (95% CI) | accepted | rejected |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        intents = ("not collected" if r.get("gpu_intents") is None
                   else f"**none** ({r['evidence_missing'][:60]})" if r.get("evidence_missing") else str(r["gpu_intents"]))
        if r.get("speedup") is None:
            out.append(f"| {r['workload']} | {intents} | - | - | failed: {r.get('error', 'no end-to-end measurement')} "
                       "| - | - | - | - |")
            continue
        comp = (f"{r['compiled_port_speedup']:.2f}x ({r['compiled_port_ci'][0]:.2f}-{r['compiled_port_ci'][1]:.2f})"
                if r.get("compiled_port_speedup") else "-")
        v = r.get("verify")
        ver = f"{v['speedup']:.2f}x ({v['ci'][0]:.2f}-{v['ci'][1]:.2f}, {v['runs_per_arm']})" if v else "-"
        out.append(f"| {r['workload']} | {intents} | {r['port_step_ms']:.0f} ms | {r['final_step_ms']:.0f} ms | "
                   f"**{r['speedup']:.2f}x** ({r['ci'][0]:.2f}-{r['ci'][1]:.2f}) | {ver} | {comp} | "
                   f"{len(r['accepted'])}: {', '.join(r['accepted']) or '-'} | {r['rejected']} |")
    speedups = [r["speedup"] for r in rows if r.get("speedup")]
    if speedups:
        out.append(f"\nGeometric mean of final vs port over {len(speedups)} workloads: "
                   f"{statistics.geometric_mean(speedups):.2f}x.")
    verified = [r["verify"]["speedup"] for r in rows if r.get("verify")]
    if verified:
        out.append(f"Geometric mean of the re-verified ratios over {len(verified)} workloads: "
                   f"{statistics.geometric_mean(verified):.2f}x.")
    out.append(f"\nMachine: {cpu_signature()}; torch {torch.__version__}.")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=6.0, help="loop budget per workload")
    ap.add_argument("--budget", type=int, default=8, help="most candidates per workload")
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--runs-root", type=Path, default=Path("runs"))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--reuse", action="append", default=[], metavar="NAME=RUN_DIR",
                    help="take this workload's row from a finished run folder instead of running it again")
    ap.add_argument("extra", nargs="*", help="more `trainbridge run` options, after --")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    reuse = dict(r.split("=", 1) for r in a.reuse)
    for name in a.only.split(","):
        if name in reuse:
            print(f"{name}: row from {reuse[name]}", flush=True)
            rows.append(summarize(name, Path(reuse[name])))
            continue
        before = set(a.runs_root.glob("*")) if a.runs_root.exists() else set()
        cmd = [sys.executable, "-m", "trainbridge.cli", "run", str(ROOT / "workloads" / name), "--target", "cpu",
               "--minutes", str(a.minutes), "--budget", str(a.budget), "--runs-root", str(a.runs_root), *a.extra]
        print("$", " ".join(cmd), flush=True)
        proc = subprocess.run(cmd)
        new = sorted(set(a.runs_root.glob("*")) - before, key=lambda p: p.stat().st_mtime)
        if not new or not (new[-1] / "end_to_end.json").exists():
            rows.append({"workload": name, "error": f"exit {proc.returncode}"})
        else:  # exit 3 (finished without GPU evidence) still has a row: its intents column says so
            rows.append({**summarize(name, new[-1]), "exit_code": proc.returncode})
        (a.out / "workloads_cpu.json").write_text(json.dumps(rows, indent=1))
        (a.out / "workloads_cpu.md").write_text(table(rows) + "\n")
    (a.out / "workloads_cpu.json").write_text(json.dumps(rows, indent=1))  # rows reused only: written here
    (a.out / "workloads_cpu.md").write_text(table(rows) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
