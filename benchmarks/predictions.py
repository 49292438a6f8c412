"""Predicted against measured savings, over every measured recipe candidate of the ledgers read.

    python benchmarks/predictions.py [LEDGER ...] [--write-defaults] [--out benchmarks/results]

Without arguments it reads the others-programs benchmark's ledgers kept in
`benchmarks/results/others_programs_ledgers*/`. For each measured recipe candidate (a
combined candidate is the sum of its parts and is left out) it takes the raw prediction (the
profile's time of what the recipe changes x the pattern's removable share; the ledger's
`uncalibrated_saving_ms`, or `predicted_saving_ms` in ledgers written before calibration) and
the measured saving, both in % of the incumbent's step, and reports the absolute error in
points of three predictions:

- **raw**: as the planner predicted before calibration;
- **shipped**: raw x the factor fitted on the *other* programs' candidates (leave one program
  out: a program's own measurements never calibrate its own predictions here);
- **shipped + run**: as the loop predicts, the leave-one-out factor shrunk toward the ratios of
  the same recipe's candidates measured earlier in the same run (`measure.prediction`).

compile_model (the whole model compiled) is calibrated from another source as well: every run
whose end-to-end session timed `torch.compile` of the port against the port measured that
mechanism once (`--compiled-ports`, default the four-workload runs' ledgers); those
measurements enter the fitted table, not the error table (they are no candidates).

It also gives Spearman's rank correlation of each prediction with the measurement (the
planner ranks by prediction, so the order matters more than the size). `--write-defaults`
writes the factors fitted on all candidates to `trainbridge/measure/realised_shares.json`,
the table the loop ships with; `--write-table PATH` writes them elsewhere, for a run given
`TRAINBRIDGE_REALISED_SHARES=PATH`. Nothing is timed; it reads ledgers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scipy.stats import spearmanr  # noqa: E402

from trainbridge.ledger import models as ev  # noqa: E402
from trainbridge.ledger.store import Ledger  # noqa: E402
from trainbridge.measure.prediction import (  # noqa: E402
    SHIPPED_PATH, Observation, ShippedShares, calibration, fit, saving_pct)

DEFAULT_LEDGERS = sorted((ROOT / "benchmarks" / "results").glob("others_programs_ledgers*/*.ledger.jsonl"))
# runs whose end-to-end session timed torch.compile of the port (the others-programs runs skip it)
COMPILED_PORT_LEDGERS = sorted((ROOT / "benchmarks" / "results").glob("workloads_cpu-*_ledgers/*.ledger.jsonl"))


def compiled_port_observation(path: Path) -> tuple[Observation | None, str]:
    """compile_model's one measurement in a run: its end-to-end session timed torch.compile of the
    whole port against the port, the same mechanism at the port's precision. The raw prediction is
    the one the loop logged beside it, else the planner's, recomputed from the run's profile when
    that file is still where the ledger says (older ledgers); else none (and why)."""
    events = Ledger(path).events()
    started = next(e for e in events if isinstance(e, ev.RunStarted))
    finished = next((e for e in reversed(events) if isinstance(e, ev.RunFinished)), None)
    e2e = finished.end_to_end if finished else None
    comp = e2e.compiled_port_vs_port if e2e else None
    if comp is None:
        return None, f"{path.name}: no compiled port timed"
    raw = e2e.compiled_port_raw_saving_ms
    if raw is None:
        base = next((e for e in events if isinstance(e, ev.BaselineMeasured)), None)
        profile = Path(base.profile_path) if base and base.profile_path else None
        if profile is None or not profile.exists():
            return None, f"{path.name}: its raw prediction is not in the ledger and its profile is gone"
        from trainbridge.agent.planner import predicted_saving_ms
        from trainbridge.profile.analysis import ProfileReport

        raw = predicted_saving_ms("compile_model", ProfileReport.model_validate_json(profile.read_text()))
    program = Path(started.workload).name
    return Observation.of("compile_model", started.target, raw, comp, source=f"{program}/compiled_port"), ""


def candidates(path: Path) -> tuple[list[dict], str | None]:
    """The measured recipe candidates of one ledger, in order, and the CPU it ran on."""
    events = Ledger(path).events()
    started = next(e for e in events if isinstance(e, ev.RunStarted))
    base = next((e for e in events if isinstance(e, ev.BaselineMeasured)), None)
    cpu = base.environment.cpu_signature if base and base.environment else None
    program = Path(started.workload).name
    proposed = {e.candidate_id: e for e in events if isinstance(e, ev.CandidateProposed)}
    rows = []
    for m in (e for e in events if isinstance(e, ev.CandidateMeasured)):
        p = proposed.get(m.candidate_id)
        if p is None or not p.source.startswith("recipe:") or p.source == "recipe:combined":
            continue
        h = p.hypothesis
        raw_ms = h.uncalibrated_saving_ms if h.uncalibrated_saving_ms is not None else h.predicted_saving_ms
        obs = Observation.of(p.source.removeprefix("recipe:"), started.target, raw_ms, m.comparison,
                             source=f"{program}/{m.candidate_id}")
        rows.append({"program": program, "ledger": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
                     "candidate": m.candidate_id, "recipe": obs.recipe, "target": obs.target, "obs": obs,
                     "inc_ms": m.comparison.median_incumbent_ms, "measured_pct": saving_pct(m.comparison.speedup),
                     # what the run itself predicted and ranked by (calibrated when the run calibrated)
                     "logged_pct": 100.0 * h.predicted_saving_ms / m.comparison.median_incumbent_ms,
                     "low_pct": saving_pct(m.comparison.ci_low), "high_pct": saving_pct(m.comparison.ci_high)})
    return rows, cpu


def table_of(rows: list[dict], cpu: str, ledgers: list[str], command: str,
             extra: list[Observation] = ()) -> ShippedShares:
    return ShippedShares(cpu=cpu, date=time.strftime("%Y-%m-%d"), command=command, ledgers=ledgers,
                         shares=fit([r["obs"] for r in rows] + list(extra)))


def evaluate(rows: list[dict], cpu: str) -> None:
    """Fill each row's three predictions (in % of the incumbent's step)."""
    for r in rows:
        others = table_of([o for o in rows if o["program"] != r["program"]], cpu, [], "leave one program out")
        earlier = [o["obs"] for o in rows if o["ledger"] == r["ledger"] and o["seq"] < r["seq"]]
        raw_pct = 100.0 * r["obs"].raw_saving_ms / r["inc_ms"]
        r["raw_pct"] = raw_pct
        r["shipped_pct"] = raw_pct * calibration(r["recipe"], r["target"], [], table=others).factor
        r["run_pct"] = raw_pct * calibration(r["recipe"], r["target"], earlier, table=others).factor


def markdown(res: dict) -> str:
    f1 = lambda x: f"{x:.1f}"  # noqa: E731
    lines = [f"Predicted against measured saving, in % of the incumbent's step, over {res['n']} measured recipe "
             f"candidates of {len(res['ledgers'])} ledgers ({res['programs']} programs; `{res['command']}`, "
             f"{res['date']}). CPU: {res['cpu']}.", "",
             "| prediction | median absolute error (points) | mean absolute error | Spearman rank correlation |",
             "| --- | --- | --- | --- |"]
    for k, name in (("raw", "raw (profile x removable share)"),
                    ("shipped", "x factor fitted on the other programs"),
                    ("run", "x that factor shrunk toward this run's earlier measurements (the loop)"),
                    ("logged", "as the run predicted it (the ledger's hypothesis, with the table it ran with)")):
        s = res["summary"][k]
        lines.append(f"| {name} | **{f1(s['median_abs_error'])}** | {f1(s['mean_abs_error'])} | "
                     f"{s['spearman']:.2f} |")
    lines += ["", "Factors fitted on all candidates (what `--write-defaults` ships):", "",
              "| recipe | target | factor | n | ratios (measured / raw prediction, clipped to [-1, 2]) |",
              "| --- | --- | --- | --- | --- |"]
    for s in res["shares"]:
        lines.append(f"| {s['recipe']} | {s['target']} | {s['factor']:.2f} | {s['n']} | "
                     f"{', '.join(f'{x:.2f}' for x in s['ratios'])} |")
    lines += ["", "| program | candidate | raw | shipped | shipped + run | as the run predicted | measured (95% CI) |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in res["rows"]:
        lines.append(f"| {r['program']} | {r['candidate']} | {f1(r['raw_pct'])} | {f1(r['shipped_pct'])} | "
                     f"{f1(r['run_pct'])} | {f1(r['logged_pct'])} | "
                     f"{f1(r['measured_pct'])} ({f1(r['low_pct'])} to {f1(r['high_pct'])}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ledgers", nargs="*", type=Path, help="ledger.jsonl files (default: the others-programs ones)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--stem", default="predictions", help="file name of the results: STEM.md / STEM.json")
    ap.add_argument("--write-defaults", action="store_true", help=f"write the fitted factors to {SHIPPED_PATH.name}")
    ap.add_argument("--write-table", type=Path, help="write the fitted factors here (for $TRAINBRIDGE_REALISED_SHARES)")
    ap.add_argument("--compiled-ports", nargs="*", type=Path, default=None,
                    help="ledgers whose end-to-end torch.compile-of-the-port arm calibrates compile_model "
                         "(default: the four-workload runs' ledgers under benchmarks/results/workloads_cpu-*_ledgers/)")
    a = ap.parse_args()
    paths = [p.resolve() for p in a.ledgers] or DEFAULT_LEDGERS
    if not paths:
        ap.error("no ledgers given and none found under benchmarks/results/others_programs_ledgers*/")
    rows, cpus = [], set()
    for path in paths:
        got, cpu = candidates(path)
        for i, r in enumerate(got):
            r["seq"] = i
        rows += got
        cpus.add(cpu)
    if not rows:
        ap.error("the ledgers hold no measured recipe candidate")
    cpu = " / ".join(sorted(c or "CPU not recorded" for c in cpus))
    evaluate(rows, cpu)
    command = "python benchmarks/predictions.py " + " ".join(sys.argv[1:])
    extra, skipped, compiled_ledgers = [], [], []
    for path in (COMPILED_PORT_LEDGERS if a.compiled_ports is None else [p.resolve() for p in a.compiled_ports]):
        obs, why = compiled_port_observation(path)
        if obs is None:
            skipped.append(why)
            continue
        extra.append(obs)
        compiled_ledgers.append(str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path))
    ledgers = sorted({r["ledger"] for r in rows})
    table = table_of(rows, cpu, ledgers + compiled_ledgers, command, extra)
    measured = [r["measured_pct"] for r in rows]

    def summary(key: str) -> dict:
        errs = [abs(r[key] - r["measured_pct"]) for r in rows]
        return {"median_abs_error": statistics.median(errs), "mean_abs_error": statistics.fmean(errs),
                "spearman": float(spearmanr([r[key] for r in rows], measured).statistic)}

    res = {"cpu": cpu, "date": time.strftime("%Y-%m-%d"), "command": command, "ledgers": ledgers, "n": len(rows),
           "programs": len({r["program"] for r in rows}),
           "summary": {"raw": summary("raw_pct"), "shipped": summary("shipped_pct"), "run": summary("run_pct"),
                       "logged": summary("logged_pct")},
           "shares": [s.model_dump() for s in table.shares],
           "compiled_port_observations": [o.model_dump() | {"ratio": o.ratio} for o in extra],
           "compiled_ports_skipped": skipped,
           "rows": [{k: v for k, v in r.items() if k != "obs"} | {"raw_saving_ms": r["obs"].raw_saving_ms,
                                                                 "measured_saving_ms": r["obs"].measured_saving_ms}
                    for r in rows]}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.stem}.json").write_text(json.dumps(res, indent=1))
    (a.out / f"{a.stem}.md").write_text(markdown(res))
    for path in ([SHIPPED_PATH] if a.write_defaults else []) + ([a.write_table] if a.write_table else []):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(table.model_dump_json(indent=1) + "\n")
    print(markdown(res))


if __name__ == "__main__":
    main()
