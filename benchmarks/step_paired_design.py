"""Which per-round statistic scatters least on real A/A lockstep rounds, and how it falls with steps.

    python benchmarks/step_paired_design.py [benchmarks/results/step_paired_design.json]

The rounds (nanogpt/cpu against itself, lockstep, 50 measured steps a run) were measured once
to choose the acceptance rule's statistic (`measure.statistics`, step-paired); this script only
reads them. For each statistic and for the first K steps of every run it prints the sd over
rounds of the round's log speedup (A/A: the truth is 0, so the sd is the statistic's noise),
and the noise a round would have if its steps were independent pairs (the robust sd of one
step pair / sqrt(K)): when the two agree, the noise is within rounds, and more steps cut it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

HERE = Path(__file__).resolve().parent
STATISTICS = {
    "log ratio of run medians (the old rule)": lambda a, b: math.log(np.median(a) / np.median(b)),
    "median of step-paired log ratios": lambda a, b: float(np.median(np.log(a / b))),
    "20%-trimmed mean of step-paired log ratios (the rule)": lambda a, b: float(stats.trim_mean(np.log(a / b), 0.2)),
    "mean of step-paired log ratios": lambda a, b: float(np.mean(np.log(a / b))),
}


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results" / "step_paired_design.json"
    data = json.loads(path.read_text())
    rounds = [(np.array(r["incumbent_ms"]), np.array(r["candidate_ms"])) for r in data["rounds"]]
    steps = min(a.size for a, _ in rounds)
    ks = [k for k in (10, 20, 30, 50) if k <= steps]
    print(f"{len(rounds)} A/A rounds, {data['cpu']}; sd over rounds of a round's log speedup\n")
    print("| statistic | " + " | ".join(f"K={k}" for k in ks) + " |")
    print("|---|" + "---|" * len(ks))
    for name, f in STATISTICS.items():
        sds = [np.std([f(a[:k], b[:k]) for a, b in rounds], ddof=1) for k in ks]
        print(f"| {name} | " + " | ".join(f"{s:.4f}" for s in sds) + " |")
    pair_sd = float(np.median([stats.median_abs_deviation(np.log(a / b), scale="normal") for a, b in rounds]))
    print("| independent step pairs would give (robust sd of a pair / sqrt K) | "
          + " | ".join(f"{pair_sd / math.sqrt(k):.4f}" for k in ks) + " |")


if __name__ == "__main__":
    main()
