"""How small an effect the acceptance rule resolves, and how often it is fooled, measured.

    python benchmarks/calibration.py [--aa-rounds 80] [--power-rounds 40] [--effect 0.02]
                                     [--scheme lockstep] [--out benchmarks/results]

On nanogpt's cpu port, with the loop's own rule and defaults (`RunConfig`: bar, rounds per
look, looks; `acceptance.judge_sequentially`, the step-paired statistic of
`measure.statistics`) and the manifest's timed steps:

1. **A/A rounds**: the same program in both arms, `--aa-rounds` rounds back to back (lockstep:
   both processes alive, taking turns one step at a time; pairs: one process after the other).
2. **Power rounds**: the incumbent slowed by a known `--effect` (a sleep of that fraction of
   the A/A rounds' median step after every optimizer step), so the candidate is truly
   `1 + effect` faster.
3. **Sessions**: the rule is run on the rounds in the order they were measured, as the loop
   runs it: a session takes one look's rounds, and the next look's rounds when the rule asks
   for another look. Every session uses its own real rounds; none is reused or resampled.

Figures: the A/A false-accept rate (share of A/A sessions accepted); the power at the
injected effect (share of power sessions accepted) and the speedup measured there; the sd of
a round's step-paired log ratio in the A/A rounds, and from it the rule's minimum detectable
effect at 80% power and its accept rate at no effect and at the bar (`measure.sequential`,
simulated); the run-level risk of accepting a candidate that does nothing, over a run of the
default budget. Also, as a check of the computed MDE on real noise: the A/A sessions again
with every candidate step scaled by 1 / (1 + effect) (a pure multiplicative gain).

Rounds are saved as they are measured (`<work>/rounds-<kind>.json`, `--reuse` reads them back
and measures only what is missing), so a crash loses at most one round. Results go to
`<out>/calibration.json` and `<out>/calibration.md`, named by the CPU. Run it alone on an
otherwise idle machine: a lockstep round of nanogpt/cpu takes about 40 s here.
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

import numpy as np  # noqa: E402

from trainbridge.agent.state import RunConfig  # noqa: E402
from trainbridge.harness.runner import port_sources  # noqa: E402
from trainbridge.measure import sequential  # noqa: E402
from trainbridge.measure.acceptance import judge, judge_sequentially  # noqa: E402
from trainbridge.measure.statistics import _as_runs, round_log_ratios  # noqa: E402
from trainbridge.measure.timing import candidate_session, lockstep_session  # noqa: E402
from trainbridge.targets.capabilities import cpu_signature  # noqa: E402
from trainbridge.workload import load_workload  # noqa: E402

DEFAULTS = RunConfig.model_fields
BAR = DEFAULTS["min_effect"].default
PAIRS = DEFAULTS["timing_pairs"].default
LOOKS = DEFAULTS["looks"].default
CONFIDENCE = DEFAULTS["confidence"].default
BUDGET = 10  # `trainbridge run --budget` default: candidates per run, for the run-level risk
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
    text = "".join(lines[:last + 1]) + SLOW_PRELUDE.format(sleep_s=sleep_s) + "".join(lines[last + 1:])
    return {**files, entry: text}


def measure_rounds(scheme: str, wl, incumbent, candidate, rounds: int, path: Path, work: Path) -> list[dict]:
    """`rounds` rounds of incumbent against candidate, appended to `path` as each pair of rounds ends
    (two at a time, so the arm that goes first alternates as in the loop)."""
    done = json.loads(path.read_text()) if path.exists() else []
    while len(done) < rounds:
        t0 = time.monotonic()
        n = min(2, rounds - len(done))
        out = work / f"{path.stem}-{len(done):03d}"
        if scheme == "lockstep":
            s = lockstep_session(wl, "cpu", {"incumbent": incumbent, "candidate": candidate}, n, out_dir=out,
                                 seed=SEED)
        else:
            s = candidate_session(wl, "cpu", incumbent=incumbent, candidate=candidate, pairs=n, out_dir=out, seed=SEED)
        for inc, cand in zip(*s.pair("incumbent", "candidate")):
            done.append({"incumbent_ms": inc, "candidate_ms": cand})
        path.write_text(json.dumps(done))
        print(f"{path.stem}: {len(done)}/{rounds} rounds ({time.monotonic() - t0:.0f} s){'; ' if s.problems else ''}"
              f"{'; '.join(s.problems)}", flush=True)
    return done[:rounds]


class _PoolEmpty(Exception):
    """The measured rounds ran out in the middle of a session: that session is not counted."""


def sessions(rounds: list[dict], scale_candidate: float = 1.0) -> list[dict]:
    """The loop's rule run over the rounds in measured order; each session takes what it needs."""
    pos, rows = 0, []

    def take():
        nonlocal pos
        if pos + PAIRS > len(rounds):
            raise _PoolEmpty
        chunk = rounds[pos:pos + PAIRS]
        pos += PAIRS
        return ([r["incumbent_ms"] for r in chunk], [[x * scale_candidate for x in r["candidate_ms"]] for r in chunk])

    while True:
        start = pos
        try:
            first = take()
            inc, cand, comp, note = judge_sequentially(first, take, bar=BAR, confidence=CONFIDENCE, looks=LOOKS,
                                                       pairs_per_look=PAIRS)
        except _PoolEmpty:
            return rows
        rows.append({"rounds": [start, pos], "decision": comp.decision, "speedup": comp.speedup,
                     "ci_low": comp.ci_low, "ci_high": comp.ci_high, "looks": (pos - start) // PAIRS, "note": note})


def first_looks(rounds: list[dict]) -> list[dict]:
    """Every disjoint block of one look's rounds judged at the first look's level: more real A/A
    measurements than whole sessions give, of the look that decides most candidates."""
    level = sequential.plan(LOOKS, CONFIDENCE, PAIRS).confidence_at(1)
    rows = []
    for start in range(0, len(rounds) - PAIRS + 1, PAIRS):
        chunk = rounds[start:start + PAIRS]
        comp = judge([r["incumbent_ms"] for r in chunk], [r["candidate_ms"] for r in chunk], bar=BAR,
                     confidence=level)
        rows.append({"rounds": [start, start + PAIRS], "decision": comp.decision, "speedup": comp.speedup,
                     "ci_low": comp.ci_low, "ci_high": comp.ci_high, "looks": 1})
    return rows


def summary(rows: list[dict]) -> dict:
    accepted = sum(r["decision"] == "accept" for r in rows)
    return {"sessions": len(rows), "accepted": accepted, "rate": accepted / len(rows) if rows else None,
            "mean_looks": statistics.mean(r["looks"] for r in rows) if rows else None,
            "median_speedup": statistics.median(r["speedup"] for r in rows) if rows else None,
            "median_ci_width": statistics.median(r["ci_high"] - r["ci_low"] for r in rows) if rows else None}


def round_sd(rounds: list[dict]) -> float:
    """sd of a round's step-paired log ratio (the statistic's unit of noise)."""
    inc = _as_runs([r["incumbent_ms"] for r in rounds], "incumbent")
    cand = _as_runs([r["candidate_ms"] for r in rounds], "candidate")
    return float(np.std(round_log_ratios(inc, cand), ddof=1))


def clopper_upper(k: int, n: int, level: float = 0.95) -> float:
    """One-sided upper confidence bound of a rate seen k times in n."""
    from scipy.stats import beta
    return 1.0 if k >= n else float(beta.ppf(level, k + 1, n - k))


def markdown(r: dict) -> str:
    aa, pw, shift, one = r["aa"], r["power"], r["aa_shifted"], r["aa_first_looks"]
    pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
    f3 = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    return "\n".join([
        f"# Acceptance-rule calibration on nanogpt/cpu ({r['cpu']})", "",
        f"`{r['command']}` ({r['minutes']:.0f} min of measuring, {r['date']}). Scheme: {r['scheme']}; "
        f"{r['timed_steps']} timed steps a run; the loop's defaults: bar {BAR:.1%}, {PAIRS} rounds a look, up to "
        f"{LOOKS} looks (group-sequential, one-sided false-accept rate {(1 - CONFIDENCE) / 2:g} at the bar); "
        "step-paired statistic. Sessions are run by the rule over real rounds in measured order, none reused.", "",
        "| measured | sessions | accepted | mean looks | median speedup | median CI width |",
        "|---|---|---|---|---|---|",
        f"| A/A (same program) | {aa['sessions']} | {aa['accepted']} ({pct(aa['rate'])}; 95% upper bound "
        f"{pct(r['aa_rate_upper95'])}) | {f3(aa['mean_looks'])} | {f3(aa['median_speedup'])} | "
        f"{f3(aa['median_ci_width'])} |",
        f"| A/A, each block of {PAIRS} rounds judged once at the first look's level | {one['sessions']} | "
        f"{one['accepted']} ({pct(one['rate'])}) | 1 | {f3(one['median_speedup'])} | {f3(one['median_ci_width'])} |",
        *([f"| injected {r['effect']:.0%} (a {r['sleep_ms']:.2f} ms sleep a step) | {pw['sessions']} | "
           f"{pw['accepted']} ({pct(pw['rate'])}) | {f3(pw['mean_looks'])} | {f3(pw['median_speedup'])} | "
           f"{f3(pw['median_ci_width'])} |"] if r["power_rounds"] else []),
        f"| A/A rounds, candidate steps / {1 + r['effect']:g} | {shift['sessions']} | {shift['accepted']} "
        f"({pct(shift['rate'])}) | {f3(shift['mean_looks'])} | {f3(shift['median_speedup'])} | "
        f"{f3(shift['median_ci_width'])} |", "",
        f"sd of a round's step-paired log ratio (A/A, {r['aa_rounds']} rounds): {r['round_sd']:.4f}. With it, the "
        f"rule (simulated, `measure.sequential`): minimum detectable effect at 80% power "
        f"**{pct(r['mde_80'])}**; accept rate {pct(r['sim_at_2pct']['accept_rate'])} at a true 2% "
        f"({r['sim_at_2pct']['mean_pairs']:.1f} rounds on average), {pct(r['sim_at_0']['accept_rate'])} at no "
        f"effect, {pct(r['sim_at_bar']['accept_rate'])} exactly at the bar. Run-level risk: a run of {BUDGET} "
        f"candidates that all do nothing accepts one with probability {pct(r['run_risk_null'])} "
        f"(1 - (1 - p)^{BUDGET}, p the simulated rate at no effect).", "",
        *([f"Injected slowdown: {r['sleep_ms']:.2f} ms per step on a median step of {r['step_ms']:.1f} ms.", ""]
          if r["power_rounds"] else [])])


def main() -> None:
    global BAR
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aa-rounds", type=int, default=80, help="A/A rounds measured (sessions are cut from them)")
    ap.add_argument("--power-rounds", type=int, default=40, help="rounds with the injected effect")
    ap.add_argument("--effect", type=float, default=0.02, help="injected true speedup for the power rounds")
    ap.add_argument("--scheme", choices=("lockstep", "pairs"), default="lockstep")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "calibration")
    ap.add_argument("--reuse", action="store_true", help="keep the rounds already in --work, measure the rest")
    ap.add_argument("--bar", type=float, default=BAR, help="the rule's bar (default: the loop's, RunConfig.min_effect)")
    a = ap.parse_args()
    BAR = a.bar
    if a.aa_rounds < 2 * PAIRS or a.power_rounds < 0 or not 0 < a.effect < 1:
        ap.error(f"need --aa-rounds >= {2 * PAIRS}, --power-rounds >= 0 and 0 < --effect < 1")
    wl = load_workload(ROOT / "workloads" / "nanogpt")
    port, _ = port_sources(wl, "cpu")
    a.work.mkdir(parents=True, exist_ok=True)
    if not a.reuse:
        for old in a.work.glob(f"rounds-{a.scheme}-*.json"):
            old.unlink()
    t0 = time.monotonic()
    aa_rounds = measure_rounds(a.scheme, wl, port, port, a.aa_rounds, a.work / f"rounds-{a.scheme}-aa.json", a.work)
    step_ms = float(np.median([x for r in aa_rounds for x in r["incumbent_ms"]]))
    # the sleep the power rounds were measured with is kept beside them: a later --reuse (with
    # more A/A rounds, so another median step) must report the sleep that was injected
    sleep_file = a.work / f"rounds-{a.scheme}-power-sleep.json"
    if sleep_file.exists():
        sleep_s = json.loads(sleep_file.read_text())["sleep_s"]
    else:
        sleep_s = a.effect * step_ms / 1e3
        sleep_file.write_text(json.dumps({"sleep_s": sleep_s, "median_aa_step_ms": step_ms, "effect": a.effect}))
    slow = slowed(port, wl.manifest.entry, sleep_s)
    power_rounds = measure_rounds(a.scheme, wl, slow, port, a.power_rounds,
                                  a.work / f"rounds-{a.scheme}-power.json", a.work)
    minutes = (time.monotonic() - t0) / 60
    aa, pw, shifted = sessions(aa_rounds), sessions(power_rounds), sessions(aa_rounds, 1 / (1 + a.effect))
    looks1 = first_looks(aa_rounds)
    sd = round_sd(aa_rounds)
    plan = sequential.plan(LOOKS, CONFIDENCE, PAIRS)
    at = lambda e: sequential.operating_point(plan, sd_log=sd, bar=BAR, effect=e).model_dump()  # noqa: E731
    at0 = at(0.0)
    result = {
        "cpu": cpu_signature(), "date": time.strftime("%Y-%m-%d"), "scheme": a.scheme, "effect": a.effect,
        "command": "python benchmarks/calibration.py " + " ".join(sys.argv[1:]),
        "timed_steps": wl.manifest.steps.timed or wl.manifest.steps.measured, "bar": BAR, "pairs_per_look": PAIRS,
        "bar_is_loop_default": BAR == DEFAULTS["min_effect"].default,
        "looks": LOOKS, "aa_rounds": len(aa_rounds), "power_rounds": len(power_rounds), "step_ms": step_ms,
        "sleep_ms": sleep_s * 1e3, "minutes": minutes,
        "aa": summary(aa), "power": summary(pw), "aa_shifted": summary(shifted), "aa_first_looks": summary(looks1),
        "aa_rate_upper95": clopper_upper(summary(aa)["accepted"], len(aa)) if aa else None,
        "round_sd": sd, "mde_80": sequential.minimum_detectable_effect(plan, sd_log=sd, bar=BAR),
        "sim_at_0": at0, "sim_at_bar": at(BAR), "sim_at_2pct": at(0.02),
        "run_risk_null": 1 - (1 - at0["accept_rate"]) ** BUDGET,
        "sessions": {"aa": aa, "power": pw, "aa_shifted": shifted, "aa_first_looks": looks1},
        "rounds": {"aa": aa_rounds, "power": power_rounds},
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "calibration.json").write_text(json.dumps(result, indent=1))
    (a.out / "calibration.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
