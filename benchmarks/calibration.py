"""How small an effect the acceptance rule resolves, and how often it is fooled, measured.

    python benchmarks/calibration.py [--sessions 20] [--power-sessions 10] [--pairs 3] [--looks 3]
                                     [--effect 0.02] [--schemes pairs,lockstep] [--out benchmarks/results]

On nanogpt's cpu port, with the loop's own rule (`measure.acceptance.judge_sequentially` at
the 2% bar: up to `--looks` sessions of `--pairs` rounds, each look at its group-sequential
level) and its default number of pairs, the timing schemes are run side by side, session by
session, so a drift of the machine falls on both:

- **pairs**: one process per arm per round, one after the other (the loop's scheme);
- **lockstep**: both arms' processes alive together, taking turns one step at a time
  (`harness.lockstep`), the next arm released once the last one stopped running;
- **lockstep-unsettled**: the same, the next arm released at once (as lockstep was before
  `harness.quiescence`: the waiting arm's OpenMP workers still spinning into the other's step).

For each scheme:

- **A/A sessions**: the same program in both arms. The false-accept rate is the share of
  sessions the rule accepts (it should be at most 5%); the spread of their log speedups gives
  the minimum detectable effect at 80% power, `exp((z_0.975 + z_0.8) * sd) - 1`.
- **Power sessions**: the incumbent slowed by a known `--effect` (a sleep of that fraction of
  the measured step after every optimizer step, sized from the A/A sessions' median step), so
  the candidate is truly `1 + effect` faster. Power is the share of these sessions accepted.

Results (raw per-session figures included) go to `<out>/calibration.json` and a Markdown
table `<out>/calibration.md`, named by the CPU they were measured on. Run it alone on an
otherwise idle machine: it takes about 40 minutes on a 2-core machine at the defaults.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scipy.stats import norm  # noqa: E402

from trainbridge.harness import lockstep  # noqa: E402
from trainbridge.harness.runner import port_sources  # noqa: E402
from trainbridge.measure.acceptance import judge_sequentially  # noqa: E402
from trainbridge.measure.timing import TimingSession, candidate_session, lockstep_session  # noqa: E402
from trainbridge.targets.capabilities import cpu_signature  # noqa: E402
from trainbridge.workload import load_workload  # noqa: E402

SCHEMES = ("pairs", "lockstep", "lockstep-unsettled")
BAR = 0.02
CONFIDENCE = 0.95
SEED = 1337
SLOW_PRELUDE = """
import time as _calibration_time
from torch.optim.optimizer import register_optimizer_step_post_hook as _calibration_post
_calibration_seen = set()
def _calibration_slow(opt, *a):
    _calibration_seen.add(id(opt))
    if len(_calibration_seen) and id(opt) == min(_calibration_seen):  # once per step, whatever the optimizers
        _calibration_time.sleep({sleep_s!r})
_calibration_post(_calibration_slow)
"""


def slowed(files: dict[str, str], entry: str, sleep_s: float) -> dict[str, str]:
    """The program with a fixed sleep after one optimizer's step: a known, constant slowdown."""
    text = files[entry]
    lines = text.splitlines(keepends=True)
    # after the last top-level import, so `torch` is imported
    last = max(i for i, ln in enumerate(lines) if ln.startswith(("import ", "from ")) and "__future__" not in ln)
    return {**files, entry: "".join(lines[:last + 1]) + SLOW_PRELUDE.format(sleep_s=sleep_s) + "".join(lines[last + 1:])}


def run_session(scheme: str, wl, incumbent, candidate, pairs: int, out: Path) -> TimingSession:
    if scheme == "pairs":
        return candidate_session(wl, "cpu", incumbent=incumbent, candidate=candidate, pairs=pairs, out_dir=out,
                                 seed=SEED)
    saved = lockstep.SETTLE_CAP_S
    if scheme == "lockstep-unsettled":  # the scheme as it was: the next arm released at once
        lockstep.SETTLE_CAP_S = 0.0
    try:
        return lockstep_session(wl, "cpu", {"incumbent": incumbent, "candidate": candidate}, pairs, out_dir=out,
                                seed=SEED)
    finally:
        lockstep.SETTLE_CAP_S = saved


def judged(time_session, looks: int, pairs: int) -> dict:
    """The loop's own rule on one measurement: a session, and more where the rule asks for
    another look (`acceptance.judge_sequentially`)."""
    sessions = [time_session()]

    def again():
        sessions.append(time_session())
        return sessions[-1].pair("incumbent", "candidate")

    first = sessions[0]
    row = {"rounds_kept": first.rounds_kept, "problems": first.problems}
    if first.rounds_kept < 2:
        return {**row, "decision": None}
    inc, cand, comp, note = judge_sequentially(first.pair("incumbent", "candidate"), again, bar=BAR,
                                               confidence=CONFIDENCE, looks=looks, pairs_per_look=pairs)
    return {**row, "decision": comp.decision, "speedup": comp.speedup, "ci_low": comp.ci_low, "ci_high": comp.ci_high,
            "looks": len(sessions), "note": note, "rounds_total": sum(s.rounds_kept for s in sessions),
            "run_medians_incumbent_ms": comp.run_medians_incumbent_ms,
            "run_medians_candidate_ms": comp.run_medians_candidate_ms,
            "median_incumbent_ms": comp.median_incumbent_ms, "median_candidate_ms": comp.median_candidate_ms}


def summary(rows: list[dict], kind: str) -> dict:
    done = [r for r in rows if r.get("decision")]
    accepts = sum(r["decision"] == "accept" for r in done)
    logs = [math.log(r["speedup"]) for r in done]
    out = {"sessions": len(rows), "judged": len(done), "accepted": accepts,
           "mean_looks": statistics.mean(r.get("looks", 1) for r in done) if done else None,
           "rate": accepts / len(done) if done else None,
           "median_speedup": statistics.median([r["speedup"] for r in done]) if done else None,
           "median_ci_width": statistics.median([r["ci_high"] - r["ci_low"] for r in done]) if done else None}
    if len(logs) >= 3:
        sd = statistics.stdev(logs)
        out["sd_log_speedup"] = sd
        if kind == "aa":
            out["mde_80"] = math.exp((norm.ppf(0.975) + norm.ppf(0.8)) * sd) - 1
    return out


def markdown(result: dict) -> str:
    lines = [f"# Acceptance-rule calibration on nanogpt/cpu ({result['cpu']})", "",
             f"`python benchmarks/calibration.py --sessions {result['sessions']} --power-sessions "
             f"{result['power_sessions']} --pairs {result['pairs']} --looks {result['looks']} --effect "
             f"{result['effect']} --schemes {','.join(result['schemes'])}` "
             f"({result['minutes']:.0f} min, {result['date']}). Rule: accept when the interval's low end "
             f"clears {1 + BAR:.2f}x, up to {result['looks']} sessions of {result['pairs']} rounds, each look at its "
             f"group-sequential level (one-sided false-accept rate {(1 - CONFIDENCE) / 2:g} over all looks).", "",
             "| scheme | A/A sessions | A/A false accepts | mean looks | A/A median CI width | sd(log speedup) "
             f"| MDE at 80% power | power at {100 * result['effect']:g}% (injected) | median measured speedup there "
             "| sd(log speedup) there |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for scheme in result["schemes"]:
        aa, pw = result["schemes"][scheme]["aa"], result["schemes"][scheme]["power"]
        fmt = lambda v, f="{:.3f}": "-" if v is None else f.format(v)  # noqa: E731
        lines.append(f"| {scheme} | {aa['judged']} | {aa['accepted']} ({fmt(aa['rate'], '{:.0%}')}) | "
                     f"{fmt(aa['mean_looks'], '{:.1f}')} | "
                     f"{fmt(aa['median_ci_width'])} | {fmt(aa.get('sd_log_speedup'), '{:.4f}')} | "
                     f"{fmt(aa.get('mde_80'), '{:.1%}')} | {pw['accepted']}/{pw['judged']} | "
                     f"{fmt(pw['median_speedup'])} | {fmt(pw.get('sd_log_speedup'), '{:.4f}')} |")
    lines += ["", f"Injected slowdown: {result['sleep_ms']:.2f} ms per step on a median step of "
                  f"{result['step_ms']:.1f} ms (A/A sessions)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=20, help="A/A sessions per scheme (at least 20 for the figure)")
    ap.add_argument("--power-sessions", type=int, default=10)
    ap.add_argument("--pairs", type=int, default=3, help="rounds per session (the loop's default)")
    ap.add_argument("--looks", type=int, default=3, help="sessions at most per measurement (the loop's default)")
    ap.add_argument("--schemes", default=",".join(SCHEMES), help="timing schemes compared, comma-separated")
    ap.add_argument("--effect", type=float, default=0.02, help="injected true speedup for the power sessions")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "calibration")
    a = ap.parse_args()
    schemes = tuple(x for x in a.schemes.split(",") if x)
    if a.sessions < 1 or a.power_sessions < 0 or a.pairs < 2 or a.looks < 1 or not 0 < a.effect < 1 \
            or not schemes or set(schemes) - set(SCHEMES):
        ap.error(f"need --sessions >= 1, --power-sessions >= 0, --pairs >= 2, --looks >= 1, 0 < --effect < 1 "
                 f"and --schemes from {','.join(SCHEMES)}")
    wl = load_workload(ROOT / "workloads" / "nanogpt")
    port, _ = port_sources(wl, "cpu")
    t0 = time.monotonic()
    rows: dict[str, dict[str, list]] = {s: {"aa": [], "power": []} for s in schemes}
    for i in range(a.sessions):
        for scheme in (schemes if i % 2 == 0 else tuple(reversed(schemes))):
            r = judged(lambda: run_session(scheme, wl, port, port, a.pairs, a.work / f"aa-{scheme}-{i:02d}"),
                       a.looks, a.pairs)
            rows[scheme]["aa"].append(r)
            print(f"A/A {i + 1}/{a.sessions} {scheme}: {r.get('decision')} {r.get('speedup', float('nan')):.3f} "
                  f"[{r.get('ci_low', float('nan')):.3f}, {r.get('ci_high', float('nan')):.3f}]", flush=True)
    step_ms = statistics.median(r["median_incumbent_ms"] for s in schemes for r in rows[s]["aa"] if r.get("decision"))
    sleep_s = a.effect * step_ms / 1e3
    slow = slowed(port, wl.manifest.entry, sleep_s)
    for i in range(a.power_sessions):
        for scheme in (schemes if i % 2 == 0 else tuple(reversed(schemes))):
            r = judged(lambda: run_session(scheme, wl, slow, port, a.pairs, a.work / f"power-{scheme}-{i:02d}"),
                       a.looks, a.pairs)
            rows[scheme]["power"].append(r)
            print(f"power {i + 1}/{a.power_sessions} {scheme}: {r.get('decision')} "
                  f"{r.get('speedup', float('nan')):.3f}", flush=True)
    result = {"cpu": cpu_signature(), "date": time.strftime("%Y-%m-%d"), "sessions": a.sessions,
              "power_sessions": a.power_sessions, "pairs": a.pairs, "looks": a.looks, "effect": a.effect,
              "step_ms": step_ms,
              "sleep_ms": sleep_s * 1e3, "minutes": (time.monotonic() - t0) / 60,
              "schemes": {s: {"aa": summary(rows[s]["aa"], "aa"), "power": summary(rows[s]["power"], "power"),
                              "raw": rows[s]} for s in schemes}}
    a.out.mkdir(parents=True, exist_ok=True)
    stem = a.out / f"calibration-{a.looks}look{'s' if a.looks > 1 else ''}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
