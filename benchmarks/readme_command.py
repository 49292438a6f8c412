"""The README's own command at its defaults, timed as a user sees it.

    python benchmarks/readme_command.py [--out benchmarks/results] [--reuse RUN_DIR]

A clean copy of the committed tree (`git archive HEAD`) goes to a temporary folder; from its
root, `trainbridge run workloads/nanogpt` runs exactly as the README says (relative paths,
every option at its default). Measured: the command's wall time from launch to exit, and from
its ledger how the final gain built up candidate by candidate: the loop's own estimate of the
incumbent's speedup after each decision, the share of the final gain (in log terms) reached
within the first five candidates, and the end-to-end session's final-vs-port interval.
The issue asks for <= 15 minutes and >= 80% of the gain within five candidates.

Writes `readme_command.{md,json}` to --out and copies the run's ledger and report beside them.
Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainbridge.ledger import models as ev  # noqa: E402
from trainbridge.ledger.store import Ledger  # noqa: E402
from trainbridge.targets.capabilities import cpu_signature  # noqa: E402

COMMAND = ["trainbridge", "run", "workloads/nanogpt"]
FIRST = 5


def build_up(events: list) -> dict:
    """The incumbent's speedup after each decided candidate, and the share of the final gain by the FIRST-th."""
    proposed = {e.candidate_id: e for e in events if isinstance(e, ev.CandidateProposed)}
    steps = []
    for d in (e for e in events if isinstance(e, ev.CandidateDecided)):
        recipe = proposed[d.candidate_id].source.split(":", 1)[-1] if d.candidate_id in proposed else "?"
        steps.append({"candidate": d.candidate_id, "recipe": recipe, "decision": d.decision,
                      "incumbent_speedup": d.incumbent_speedup_vs_baseline})
    final = steps[-1]["incumbent_speedup"] if steps else 1.0
    early = steps[min(FIRST, len(steps)) - 1]["incumbent_speedup"] if steps else 1.0
    share = math.log(early) / math.log(final) if final and final > 1.0 else None
    return {"decisions": steps, "loop_final_speedup": final, f"speedup_after_{FIRST}": early,
            f"share_of_gain_within_{FIRST}": share}


def summarize(run_dir: Path, wall_s: float) -> dict:
    events = list(Ledger(run_dir / "ledger.jsonl").events())
    finished = next((e for e in reversed(events) if isinstance(e, ev.RunFinished)), None)
    started = next(e for e in events if isinstance(e, ev.RunStarted))
    e2e = finished.end_to_end if finished else None
    e2e = e2e.model_dump() if hasattr(e2e, "model_dump") else (e2e or {})
    fvp = e2e.get("final_vs_port") or {}
    return {"run_dir": str(run_dir), "command": " ".join(COMMAND), "wall_min": wall_s / 60.0,
            "budget_minutes": started.budget_minutes, "budget_candidates": started.budget_candidates,
            "done_reason": finished.done_reason if finished else None,
            "final_vs_port": {"speedup": fvp.get("speedup"), "ci": [fvp.get("ci_low"), fvp.get("ci_high")]},
            "final_vs_compiled_port": finished.final_vs_compiled if finished else None,
            **build_up(events), "machine": cpu_signature()}


def markdown(r: dict) -> str:
    share = r[f"share_of_gain_within_{FIRST}"]
    fvp = r["final_vs_port"]
    rows = "\n".join(f"| {i} | {d['candidate']} | {d['decision']} | {d['incumbent_speedup']:.3f}x |"
                     for i, d in enumerate(r["decisions"], 1))
    return (f"# `{r['command']}` at the defaults\n\n"
            f"- wall time: **{r['wall_min']:.1f} min** (budget {r['budget_minutes']:g} min, "
            f"{r['budget_candidates']} candidates); stopped: {r['done_reason']}\n"
            f"- final vs port, end-to-end session: {fvp['speedup']:.3f}x (95% CI {fvp['ci'][0]:.3f}-"
            f"{fvp['ci'][1]:.3f})\n"
            f"- the loop's incumbent after candidate {FIRST}: {r[f'speedup_after_{FIRST}']:.3f}x of "
            f"{r['loop_final_speedup']:.3f}x at the end: "
            + (f"**{share:.0%}** of the final gain" if share is not None else "no gain to share") + "\n\n"
            "| # | candidate | decision | incumbent vs port after it |\n| --- | --- | --- | --- |\n"
            f"{rows}\n\nMachine: {r['machine']}.\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--reuse", type=Path, help="summarize this run folder instead of running")
    ap.add_argument("--wall-s", type=float, help="with --reuse: the command's wall time, measured when it ran")
    args = ap.parse_args()
    if args.reuse:
        result = summarize(args.reuse.resolve(), args.wall_s if args.wall_s is not None else float("nan"))
    else:
        work = Path(tempfile.mkdtemp(prefix="readme-command-"))
        subprocess.run(f"git -C {ROOT} archive HEAD | tar -x -C {work}", shell=True, check=True)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "trainbridge.cli", *COMMAND[1:]], cwd=work)
        wall_s = time.monotonic() - t0
        runs = sorted((work / "runs").glob("*-nanogpt-cpu"))
        if proc.returncode not in (0,) or not runs:
            print(f"the command exited {proc.returncode}; runs: {runs}", file=sys.stderr)
            return 1
        result = summarize(runs[-1], wall_s)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "readme_command.json").write_text(json.dumps(result, indent=1))
    (args.out / "readme_command.md").write_text(markdown(result))
    run_dir = Path(result["run_dir"])
    for name in ("ledger.jsonl", "report.md"):
        if (run_dir / name).exists():
            shutil.copy(run_dir / name, args.out / f"readme_command_{name}")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
