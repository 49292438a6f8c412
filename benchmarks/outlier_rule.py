"""How often the outlier-contaminated round rule fires on rounds measured here, honest and not.

    python benchmarks/outlier_rule.py [--out benchmarks/results]

Nothing is timed: it re-reads the raw rounds kept by earlier measurements and applies
`trainbridge.measure.outliers.contaminated_rounds` to them as the loop would, session by session:

- the A/A rounds of every calibration result with raw rounds (`benchmarks/results/calibration*.json`:
  the same program against itself, lockstep and process pairs), grouped in sessions of the
  calibration's rounds per look (4), in the order they were measured;
- the timing sessions of every measured candidate in the others-programs ledgers
  (`benchmarks/results/others_programs*ledgers*/`: real candidates, one look = one session).

A rule that fires often on A/A rounds would select rounds by their value and narrow honest
intervals; one that never fires on anything would be dead code. The table says which.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainbridge.measure.outliers import OUTLIER_RULE, contaminated_rounds  # noqa: E402
from trainbridge.targets.capabilities import cpu_signature  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def calibration_sessions(path: Path) -> tuple[str, list[dict]]:
    data = json.loads(path.read_text())
    rounds = (data.get("rounds") or {}).get("aa") or []
    per = int(data.get("pairs_per_look") or 4)
    sessions = []
    for start in range(0, len(rounds) - per + 1, per):
        chunk = rounds[start:start + per]
        sessions.append({"incumbent": [r["incumbent_ms"] for r in chunk],
                         "candidate": [r["candidate_ms"] for r in chunk]})
    return data.get("scheme") or "?", sessions


def ledger_sessions(path: Path) -> list[dict]:
    """One session per look of each measured candidate: the looks are stored concatenated, each
    `--pairs` rounds long (the run's command line; 4 when not given)."""
    out, per = [], 4
    for line in path.read_text().splitlines():
        e = json.loads(line)
        if e.get("event") == "run_started":
            argv = e.get("argv") or []
            per = int(argv[argv.index("--pairs") + 1]) if "--pairs" in argv else 4
        if e.get("event") != "candidate_measured":
            continue
        inc, cand = e["incumbent_runs_ms"], e["candidate_runs_ms"]
        for start in range(0, len(inc), per):
            out.append({"incumbent": inc[start:start + per], "candidate": cand[start:start + per]})
    return out


def tally(sessions: list[dict]) -> dict:
    fired, rounds, examples = 0, 0, []
    for s in sessions:
        found = contaminated_rounds(s)
        rounds += len(s["incumbent"])
        fired += len(found)
        examples.extend(found.values())
    return {"sessions": len(sessions), "rounds": rounds, "dropped": fired,
            "rate": fired / rounds if rounds else None, "examples": examples[:5]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    rows = []
    for path in sorted(RESULTS.glob("calibration*.json")):
        scheme, sessions = calibration_sessions(path)
        if sessions:
            rows.append({"source": path.name, "kind": f"A/A, {scheme}", **tally(sessions)})
    for folder in sorted(RESULTS.glob("others_programs*ledgers*")):
        ledgers = sorted(folder.rglob("*ledger.jsonl"))
        sessions = [s for p in ledgers for s in ledger_sessions(p)]
        if sessions:
            rows.append({"source": f"{folder.name}/ ({len(ledgers)} runs)", "kind": "candidates", **tally(sessions)})
    result = {"cpu": cpu_signature(), "rule": OUTLIER_RULE, "command": "python benchmarks/outlier_rule.py",
              "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "outlier_rule.json").write_text(json.dumps(result, indent=1))
    lines = ["# The outlier-contaminated round rule on rounds measured here", "",
             f"Rule: {OUTLIER_RULE}.", "",
             "Rounds were measured on: " + ", ".join(sorted({json.loads(p.read_text()).get('cpu', '?')
                                                             for p in RESULTS.glob('calibration*.json')})) + ".",
             "Re-read (nothing timed) by `python benchmarks/outlier_rule.py`.", "",
             "| source | rounds of | sessions | rounds | dropped | share |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        share = f"{100 * r['rate']:.1f}%" if r["rate"] is not None else "-"
        lines.append(f"| {r['source']} | {r['kind']} | {r['sessions']} | {r['rounds']} | {r['dropped']} | {share} |")
    drops = [f"- {r['source']}: {x}" for r in rows for x in r["examples"]]
    if drops:
        lines += ["", "Rounds the rule drops (first five per source):", "", *drops]
    (args.out / "outlier_rule.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
