"""The final program against what an expert does by hand (issue 22): torch.compile of the port
with the target's best precision applied.

For each workload: the port; the run's final program, rebuilt from a shipped ledger by applying
its accepted recipes to the port in order (recipes are deterministic source rewrites); and the
expert baseline: the port with its GPU precision restored (the `autocast_reapply` recipe, bf16
autocast on this CPU's bf16 units) and compiled whole by the same plugin as the end-to-end
report's compiled-port arm (`torch.compile` of the model, two more warm-up steps). The three are
timed together in one lockstep session (`measure.timing.lockstep_session`), and compared under
the step-paired rule.

    python benchmarks/expert_baseline.py --only clip,cifar_resnet \\
        --ledgers benchmarks/results/workloads_cpu-2026-12-07_ledgers --rounds 5

Writes `expert_baseline.{md,json}` to --out (raw step times kept). Run it on an otherwise idle
machine: it times programs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainbridge.agent.report import COMPILE_PLUGIN  # noqa: E402
from trainbridge.agent.rewriters.recipes import RECIPES  # noqa: E402
from trainbridge.harness.runner import port_sources  # noqa: E402
from trainbridge.ledger import models as ev  # noqa: E402
from trainbridge.ledger.store import Ledger  # noqa: E402
from trainbridge.measure.acceptance import judge  # noqa: E402
from trainbridge.measure.timing import lockstep_session  # noqa: E402
from trainbridge.targets.capabilities import cpu_signature  # noqa: E402
from trainbridge.workload import load_workload  # noqa: E402

PRECISION_RECIPE = "autocast_reapply"


def accepted_recipes(ledger_path: Path) -> list[str]:
    """The recipes of the accepted candidates, in the order the run accepted them."""
    events = list(Ledger(ledger_path).events())
    source = {e.candidate_id: e.source for e in events if isinstance(e, ev.CandidateProposed)}
    names = []
    for e in events:
        if isinstance(e, ev.CandidateDecided) and e.decision == "accepted":
            src = source.get(e.candidate_id, "")
            if not src.startswith("recipe:"):
                raise SystemExit(f"{ledger_path}: {e.candidate_id} came from {src!r}, not a recipe: cannot rebuild it")
            names.append(src.split(":", 1)[1])
    return names


def apply_all(files: dict[str, str], names: list[str], target: str) -> dict[str, str]:
    for name in names:
        files = {**files, **RECIPES[name].apply(files, target).files}
    return files


def study(name: str, ledgers: Path, rounds: int, out: Path) -> dict:
    wl = load_workload(REPO / "workloads" / name)
    port, _ = port_sources(wl, "cpu")
    accepted = accepted_recipes(ledgers / f"{name}.ledger.jsonl")
    final = apply_all(port, accepted, "cpu")
    expert = apply_all(port, [PRECISION_RECIPE], "cpu")
    extra = {"expert": {"plugins": [COMPILE_PLUGIN], "warmup_steps": wl.manifest.steps.warmup + 2}}
    t0 = time.monotonic()
    session = lockstep_session(wl, "cpu", {"port": port, "final": final, "expert": expert}, rounds,
                               out_dir=out / name, seed=1337, run_kwargs=extra,
                               on_round=lambda i, r: print(f"  {name}: round {i + 1}/{rounds}", flush=True))
    runs = session.runs_ms
    res = {"workload": name, "accepted": accepted, "rounds_kept": session.rounds_kept, "problems": session.problems,
           "minutes": round((time.monotonic() - t0) / 60, 1), "runs_ms": runs}
    if session.rounds_kept >= 2:
        for key, (a, b) in {"final_vs_expert": ("expert", "final"), "final_vs_port": ("port", "final"),
                            "expert_vs_port": ("port", "expert")}.items():
            c = judge(runs[a], runs[b], bar=0.0, confidence=0.95)
            res[key] = {"speedup": c.speedup, "ci": [c.ci_low, c.ci_high]}
    return res


def _fmt(r: dict, key: str) -> str:
    c = r.get(key)
    return f"{c['speedup']:.3f}x ({c['ci'][0]:.3f}-{c['ci'][1]:.3f})" if c else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="clip,cifar_resnet")
    ap.add_argument("--ledgers", type=Path, default=REPO / "benchmarks" / "results" / "workloads_cpu-2026-12-07_ledgers")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="expert-baseline-") as tmp:
        for name in [n for n in args.only.split(",") if n]:
            print(f"{name}: timing port, final and expert ...", flush=True)
            results.append(study(name, args.ledgers.resolve(), args.rounds, Path(tmp)))
    cmd = "python benchmarks/expert_baseline.py " + " ".join(sys.argv[1:])
    lines = ["# Final program vs the expert baseline (torch.compile of the port, best precision)", "",
             f"`{cmd}` ({time.strftime('%Y-%m-%d')}; {cpu_signature()}). One lockstep session per workload: the "
             "port, the final program (its ledger's accepted recipes applied to the port) and the expert "
             f"baseline ({PRECISION_RECIPE} + torch.compile of the model); 95% intervals, step-paired rule.", "",
             "| workload | final = | rounds | final vs expert | final vs port | expert vs port | minutes |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['workload']} | {' + '.join(r['accepted']) or 'port'} | {r['rounds_kept']} | "
                     f"**{_fmt(r, 'final_vs_expert')}** | {_fmt(r, 'final_vs_port')} | {_fmt(r, 'expert_vs_port')} | "
                     f"{r['minutes']} |")
    for r in results:
        for p in r["problems"]:
            lines.append(f"- {r['workload']}: {p}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "expert_baseline.md").write_text("\n".join(lines) + "\n")
    (args.out / "expert_baseline.json").write_text(json.dumps({"cpu": cpu_signature(), "command": cmd,
                                                               "results": results}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
