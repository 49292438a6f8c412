"""Reproduce the README's nanogpt figures: the loop's final program vs the port and vs
`torch.compile` of the port, measured interleaved in the same run.

    python benchmarks/nanogpt_cpu.py [--runs-root runs] [extra `trainbridge run` options]

Runs `trainbridge run workloads/nanogpt --target cpu`, then prints a markdown table of
the end-to-end measurement from the run folder (raw samples in end_to_end.json).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def table(run_dir: Path) -> str:
    e2e = json.loads((run_dir / "end_to_end.json").read_text())
    rows = ["| comparison | speedup | 95% CI | median ms (ref / new) | runs x steps |", "| --- | --- | --- | --- | --- |"]
    for key, label in (("final_vs_port", "final program vs port"),
                       ("compiled_port_vs_port", "torch.compile(port) vs port"),
                       ("final_vs_compiled_port", "final program vs torch.compile(port)")):
        c = e2e.get(key)
        if not c:
            continue
        rows.append(f"| {label} | {c['speedup']:.2f}x | {c['ci_low']:.2f}-{c['ci_high']:.2f} | "
                    f"{c['median_incumbent_ms']:.0f} / {c['median_candidate_ms']:.0f} | "
                    f"{c['n_runs_candidate']} x {c['n_samples_candidate'] // max(1, c['n_runs_candidate'])} |")
    return "\n".join(rows)


def main(argv: list[str]) -> None:
    runs_root = Path("runs")
    if "--runs-root" in argv:
        runs_root = Path(argv[argv.index("--runs-root") + 1])
    before = set(runs_root.glob("*")) if runs_root.exists() else set()
    cmd = [sys.executable, "-m", "trainbridge.cli", "run", str(ROOT / "workloads" / "nanogpt"), "--target", "cpu", *argv]
    subprocess.run(cmd, check=True)
    run_dir = max(set(runs_root.glob("*")) - before, key=lambda p: p.stat().st_mtime)
    print(f"\nrun folder: {run_dir}\n")
    print(table(run_dir))


if __name__ == "__main__":
    main(sys.argv[1:])
