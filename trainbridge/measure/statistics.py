"""Acceptance statistics: is the candidate faster than the incumbent, beyond noise?

Inputs are *runs*: one list of per-step `step_ms` per separate process run, incumbent and
candidate runs interleaved (A B, B A, ...) by the caller. Steps inside one process share
its state (allocator, clocks, neighbours), so they are not independent samples: the
confidence interval comes from a hierarchical bootstrap that resamples runs first and
steps within each resampled run second, which keeps run-to-run noise in the interval.
A second interval treats each process run as one observation: a t-interval on the log
ratios of run medians, paired run by run when the runs were measured in pairs (A B, B A:
pair k is incumbent run k and candidate run k), Welch's otherwise. With two or three runs a
side the bootstrap cannot see how far apart runs can land (it only recombines the few it
has) and the t-interval, with its one or two degrees of freedom, can. The decision interval
is the union of the two (lowest low, highest high). Measured on this project's 2-core VM:
cifar_resnet runs of one program had medians 45, 32, 36, 34 ms, and with the bootstrap alone
two pairs accepted a `torch.compile` of a function that never runs in a training step at
1.43x (run 20261203-073953). The rule is one line (accept iff the interval's low end clears
`1 + min_effect`) and is checked against A/A splits of the same program (`calibrate_aa`),
which also says the smallest `min_effect` that keeps the false-accept rate at its target.

When the two arms' runs pair up step by step (same number of runs, run k of each with the
same number of steps: every protocol here times them so), the point estimate and both
intervals use the *step-paired* statistic instead: in each round, the 20%-trimmed mean of
log(incumbent step k / candidate step k). In lockstep the two steps k ran back to back, so a
slow stretch of the machine falls on both and cancels in the ratio; the trimmed mean keeps
the efficiency of a mean while a stray slow step (a neighbour's burst) cannot move it.
Measured on nanogpt/cpu (14 A/A lockstep rounds of 50 steps, AMD EPYC 2 cores): the sd of a
round's estimate was 0.013 step-paired against 0.022 from the ratio of run medians
(`benchmarks/step_paired_design.py`; 0.017 over the 86 rounds of `benchmarks/calibration.py`).
The t-interval over rounds still treats each round as one observation, so a process-level
effect (memory layout, thread placement) stays in the interval.

A robust statistic ignores a candidate's few slow steps, and so would a candidate that moves
work into every fifth step: its typical step is shorter while its training takes longer.
Whatever the statistic, a candidate is accepted only when its mean step over all timed steps
is also shorter than the incumbent's (`mean_speedup` > 1): total time is what training pays.

Raw samples are not kept here: the ledger keeps them, these models keep summary numbers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field
from scipy import stats

Runs = Sequence[Sequence[float]]

# One change giving more than this is more often a broken measurement than a win.
SUSPICIOUS_SPEEDUP = 3.0
# Bootstrap replicates are drawn in chunks of at most this many samples (memory bound).
_CHUNK_SAMPLES = 2_000_000
# Step-paired statistic: the share cut from each end of a round's step log ratios, and the
# fewest steps a run needs for it (fewer: the run medians are compared instead).
TRIM = 0.2
MIN_PAIRED_STEPS = 5


class Summary(BaseModel):
    """Order statistics of one set of step times (milliseconds)."""

    n: int
    median_ms: float
    mean_ms: float
    p10_ms: float
    p90_ms: float
    iqr_ms: float = Field(..., description="p75 - p25")
    min_ms: float
    max_ms: float
    rel_spread: float = Field(..., description="iqr_ms / median_ms (unitless)")


class Comparison(BaseModel):
    """Incumbent vs candidate step times: speedup, its interval, and the decision."""

    median_incumbent_ms: float
    median_candidate_ms: float
    speedup: float = Field(..., description="> 1 is faster. Step-paired sessions: exp of the mean over rounds of "
                                            "each round's trimmed mean log(incumbent step / candidate step); "
                                            "otherwise median incumbent / median candidate over pooled steps")
    ci_low: float
    ci_high: float
    confidence: float
    min_effect: float = Field(..., description="fractional speedup the CI low end must clear (0.02 = 2%)")
    p_value: float = Field(..., description="Mann-Whitney U on pooled steps, one-sided: candidate steps shorter")
    n_runs_incumbent: int
    n_runs_candidate: int
    n_samples_incumbent: int
    n_samples_candidate: int
    rel_spread_incumbent: float = Field(..., description="IQR / median of pooled incumbent steps")
    rel_spread_candidate: float
    mean_speedup: float | None = Field(None, description="mean incumbent step / mean candidate step over all timed "
                                                         "steps: total time; must exceed 1 for an accept")
    run_medians_incumbent_ms: list[float] = Field(..., description="per-run medians, in run order (drift shows here)")
    run_medians_candidate_ms: list[float]
    n_boot: int
    seed: int
    method: str = ("union of a hierarchical bootstrap (runs, then steps within runs) of the ratio of pooled "
                   "medians and a t-interval on log ratios of run medians (paired by run when paired)")
    boot_ci_low: float | None = Field(None, description="hierarchical bootstrap interval (runs resampled as pairs when they pair up), low end")
    boot_ci_high: float | None = None
    run_ci_low: float | None = Field(None, description="t-interval on log run-median ratios, low end")
    run_ci_high: float | None = None
    run_ci_kind: str | None = Field(None, description="'step_paired' (per-round trimmed mean of step log ratios), "
                                                     "'paired' (run k vs run k medians) or 'welch'")
    round_log_ratios: list[float] = Field(default_factory=list, description="step-paired sessions: each round's "
                                          "trimmed mean log(incumbent step / candidate step), in round order")
    decision: Literal["accept", "reject"]
    reason: str
    suspicious: bool = Field(..., description="speedup above suspicious_above: re-measure before believing it")
    suspicious_above: float = SUSPICIOUS_SPEEDUP


class AACalibration(BaseModel):
    """The acceptance rule applied to random halves of runs of one program against itself."""

    n_runs: int
    n_splits: int
    n_distinct_splits: int = Field(..., description="different partitions among the splits drawn")
    scheme: Literal["pairs", "random"]
    min_effect: float
    confidence: float
    n_false_accepts: int
    false_accept_rate: float = Field(..., description="share of splits the rule accepted; the program is the same")
    speedup_p5: float
    speedup_p50: float
    speedup_p95: float
    abs_log_speedup_p95: float
    recommended_min_effect: float = Field(..., description="exp(p95 |log speedup|) - 1 of the A/A speedups")
    min_effect_ok: bool = Field(..., description="min_effect >= recommended_min_effect")
    target_false_accept_rate: float = 0.05
    min_effect_needed: float = Field(0.0, description="smallest min_effect whose A/A false-accept rate is at most "
                                                      "target_false_accept_rate (the CI lows of the splits say)")
    note: str


# ------------------------------------------------------------------ helpers ----
def _as_runs(runs: Runs, side: str) -> list[np.ndarray]:
    """Validated float arrays; a bad sample is a harness bug, so it raises instead of voting."""
    if len(runs) == 0:
        raise ValueError(f"{side}: no runs")
    out = []
    for i, run in enumerate(runs):
        a = np.asarray(run, dtype=float)
        if a.ndim != 1 or a.size == 0:
            raise ValueError(f"{side} run {i}: no step times")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{side} run {i}: non-finite step time")
        if np.any(a <= 0):
            raise ValueError(f"{side} run {i}: step time <= 0 ms")
        out.append(a)
    return out


def _rel_spread(a: np.ndarray) -> float:
    q25, q50, q75 = np.percentile(a, [25, 50, 75])
    return float((q75 - q25) / q50)


def summarize(samples_ms: Sequence[float]) -> Summary:
    """Order statistics of step times; raises on empty or non-finite input."""
    a = _as_runs([samples_ms], "samples")[0]
    p10, q25, q50, q75, p90 = np.percentile(a, [10, 25, 50, 75, 90])
    return Summary(
        n=int(a.size), median_ms=float(q50), mean_ms=float(a.mean()), p10_ms=float(p10), p90_ms=float(p90),
        iqr_ms=float(q75 - q25), min_ms=float(a.min()), max_ms=float(a.max()), rel_spread=float((q75 - q25) / q50),
    )


def hierarchical_bootstrap_medians(runs: list[np.ndarray], n_boot: int, rng: np.random.Generator,
                                   run_draws: np.ndarray | None = None) -> np.ndarray:
    """Medians of `n_boot` pooled resamples: runs with replacement, then steps within each run.

    Each resampled run keeps its own length, so runs of unequal length weigh as they did.
    `run_draws` ([n_boot, n_runs] run indices) fixes which runs each resample takes: the same
    draws for both arms of interleaved pairs keep each pair together (a paired bootstrap).
    """
    n_runs = len(runs)
    if run_draws is not None and run_draws.shape != (n_boot, n_runs):
        raise ValueError(f"run_draws shape {run_draws.shape} != {(n_boot, n_runs)}")
    lengths = np.array([r.size for r in runs])
    width = int(lengths.max())
    padded = np.full((n_runs, width), np.nan)
    for i, r in enumerate(runs):
        padded[i, : r.size] = r
    equal = bool(np.all(lengths == width))
    chunk = max(1, _CHUNK_SAMPLES // (n_runs * width))
    out = np.empty(n_boot)
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        run_idx = rng.integers(0, n_runs, size=(b, n_runs)) if run_draws is None else run_draws[start : start + b]
        if equal:
            step_idx = rng.integers(0, width, size=(b, n_runs, width))
            vals = padded[run_idx[..., None], step_idx].reshape(b, -1)
            out[start : start + b] = np.median(vals, axis=1)
        else:
            n_steps = lengths[run_idx][..., None]
            step_idx = (rng.random((b, n_runs, width)) * n_steps).astype(np.int64)
            vals = padded[run_idx[..., None], step_idx]
            vals[np.arange(width)[None, None, :] >= n_steps] = np.nan  # keep each run's own length
            out[start : start + b] = np.nanmedian(vals.reshape(b, -1), axis=1)
    return out


def run_level_interval(inc_medians: Sequence[float], cand_medians: Sequence[float],
                       confidence: float) -> tuple[float, float, str] | None:
    """t-interval of the speedup from run medians: paired log ratios if the runs pair up, else Welch.

    Each process run is one observation, so the interval is as wide as run-to-run noise
    says, with the degrees of freedom two or three runs really give. None with fewer than two
    runs a side (no run-to-run spread to see; `compare` rejects those anyway).
    """
    li, lc = np.log(np.asarray(inc_medians, float)), np.log(np.asarray(cand_medians, float))
    q = 0.5 + confidence / 2
    if li.size == lc.size and li.size >= 2:
        d = li - lc
        se = float(d.std(ddof=1)) / math.sqrt(d.size)
        half = float(stats.t.ppf(q, d.size - 1)) * se
        return math.exp(d.mean() - half), math.exp(d.mean() + half), "paired"
    if li.size < 2 or lc.size < 2:
        return None
    vi, vc = li.var(ddof=1) / li.size, lc.var(ddof=1) / lc.size
    se = math.sqrt(vi + vc)
    diff = float(li.mean() - lc.mean())
    if se == 0:
        return math.exp(diff), math.exp(diff), "welch"
    df = (vi + vc) ** 2 / (vi ** 2 / (li.size - 1) + vc ** 2 / (lc.size - 1))
    half = float(stats.t.ppf(q, df)) * se
    return math.exp(diff - half), math.exp(diff + half), "welch"


def steps_pair_up(inc: list[np.ndarray], cand: list[np.ndarray]) -> bool:
    """Whether run k of each arm has the same number of steps, for every k (enough of them):
    step k of one is then compared with step k of the other, from the same round."""
    return (len(inc) == len(cand) and all(a.size == b.size for a, b in zip(inc, cand))
            and min(a.size for a in inc) >= MIN_PAIRED_STEPS)


def _trimmed_mean(x: np.ndarray) -> np.ndarray:
    """The `TRIM` trimmed mean along the last axis (scipy's `trim_mean` cut)."""
    n = x.shape[-1]
    cut = int(TRIM * n)
    return np.sort(x, axis=-1)[..., cut:n - cut].mean(axis=-1)


def round_log_ratios(inc: list[np.ndarray], cand: list[np.ndarray]) -> np.ndarray:
    """Per round, the trimmed mean of log(incumbent step k / candidate step k)."""
    return np.array([float(_trimmed_mean(np.log(a / b))) for a, b in zip(inc, cand)])


def step_paired_bootstrap(logs: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Speedups of `n_boot` resamples of the rounds (each round's step-paired log ratio one unit).

    Steps are not resampled again inside a round: a round's statistic already carries its steps'
    noise, and resampling both levels counts it twice (measured on nanogpt/cpu, real A/A rounds
    with a 2% gain put in: 3 accepts out of 8 sessions with steps resampled too, 7 out of 8 with
    rounds alone; `benchmarks/calibration.py`)."""
    draws = rng.integers(0, logs.size, size=(n_boot, logs.size))
    return np.exp(logs[draws].mean(axis=1))


def step_paired_interval(logs: np.ndarray, confidence: float) -> tuple[float, float] | None:
    """t-interval of the speedup over rounds, each round's step-paired log ratio one observation."""
    if logs.size < 2:
        return None
    half = float(stats.t.ppf(0.5 + confidence / 2, logs.size - 1)) * float(logs.std(ddof=1)) / math.sqrt(logs.size)
    return math.exp(logs.mean() - half), math.exp(logs.mean() + half)


def _pct(x: float) -> str:
    return f"{x * 100:g}%"


# ------------------------------------------------------------------ compare ----
_STEP_PAIRED_METHOD = ("union of a bootstrap of rounds and a t-interval over rounds of each round's 20%-trimmed "
                       "mean log(incumbent step k / candidate step k)")


def compare(
    incumbent_runs: Runs,
    candidate_runs: Runs,
    *,
    min_effect: float = 0.02,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
    min_runs: int = 2,
    suspicious_above: float = SUSPICIOUS_SPEEDUP,
) -> Comparison:
    """Speedup of candidate over incumbent with a bootstrap CI; accept iff ci_low > 1 + min_effect.

    Fewer than `min_runs` runs on a side is rejected: one process cannot show run-to-run
    noise, and that noise is the one that fooled public optimizers.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence} not in (0, 1)")
    if min_effect < 0:
        raise ValueError(f"min_effect {min_effect} < 0")
    inc, cand = _as_runs(incumbent_runs, "incumbent"), _as_runs(candidate_runs, "candidate")
    inc_pool, cand_pool = np.concatenate(inc), np.concatenate(cand)
    med_inc, med_cand = float(np.median(inc_pool)), float(np.median(cand_pool))
    mean_speedup = float(inc_pool.mean() / cand_pool.mean())

    rng = np.random.default_rng(seed)
    alpha = 1.0 - confidence
    logs = round_log_ratios(inc, cand) if steps_pair_up(inc, cand) else None
    if logs is not None:
        speedup = math.exp(float(logs.mean()))
        ratios = step_paired_bootstrap(logs, n_boot, rng)
        paired = step_paired_interval(logs, confidence)
        run_ci = (*paired, "step_paired") if paired is not None else None
    else:
        speedup = med_inc / med_cand
        # Equal run counts are interleaved pairs (timing drops a pair whose run failed): resample
        # pairs, so a slow stretch of the machine that hit both runs of a pair stays in one draw.
        draws = rng.integers(0, len(inc), size=(n_boot, len(inc))) if len(inc) == len(cand) else None
        ratios = hierarchical_bootstrap_medians(inc, n_boot, rng, draws) / \
            hierarchical_bootstrap_medians(cand, n_boot, rng, draws)
        run_ci = run_level_interval([np.median(r) for r in inc], [np.median(r) for r in cand], confidence)
    boot_low, boot_high = (float(v) for v in np.percentile(ratios, [100 * alpha / 2, 100 * (1 - alpha / 2)]))
    run_low, run_high, run_kind = run_ci if run_ci is not None else (None, None, None)
    ci_low = boot_low if run_ci is None else min(boot_low, run_low)
    ci_high = boot_high if run_ci is None else max(boot_high, run_high)

    if np.ptp(np.concatenate([inc_pool, cand_pool])) == 0:
        p_value = 1.0  # every sample equal: no evidence either way (scipy would give nan)
    else:
        p_value = float(stats.mannwhitneyu(inc_pool, cand_pool, alternative="greater").pvalue)

    bar = 1.0 + min_effect
    ci_text = f"{confidence:.0%} CI [{ci_low:.3f}, {ci_high:.3f}]"
    if len(inc) < min_runs or len(cand) < min_runs:
        decision = "reject"
        reason = (f"{len(inc)} incumbent / {len(cand)} candidate runs: at least {min_runs} per side needed "
                  f"to see run-to-run noise (speedup {speedup:.3f}x, {ci_text})")
    elif ci_low > bar and mean_speedup <= 1.0:
        decision = "reject"
        reason = (f"typical step faster (speedup {speedup:.3f}x, {ci_text}) but the mean step is not "
                  f"({mean_speedup:.3f}x over all timed steps): slow steps the statistic passes over cost more "
                  "than the fast ones save")
    elif ci_low > bar:
        decision = "accept"
        reason = f"CI low {ci_low:.3f} > {bar:.3f}: speedup {speedup:.3f}x, {ci_text}"
    elif ci_high < 1.0:
        decision = "reject"
        reason = f"candidate slower: speedup {speedup:.3f}x, {ci_text}"
    else:
        decision = "reject"
        reason = (f"{ci_text} does not clear the {_pct(min_effect)} minimum effect "
                  f"(needs CI low > {bar:.3f}; speedup {speedup:.3f}x)")
    suspicious = speedup > suspicious_above
    if suspicious:
        reason += f"; suspicious: > {suspicious_above:g}x from one change, re-measure"

    return Comparison(
        median_incumbent_ms=med_inc, median_candidate_ms=med_cand, speedup=speedup, ci_low=ci_low,
        ci_high=ci_high, confidence=confidence, min_effect=min_effect, p_value=p_value, mean_speedup=mean_speedup,
        n_runs_incumbent=len(inc), n_runs_candidate=len(cand), n_samples_incumbent=int(inc_pool.size),
        n_samples_candidate=int(cand_pool.size), rel_spread_incumbent=_rel_spread(inc_pool),
        rel_spread_candidate=_rel_spread(cand_pool),
        run_medians_incumbent_ms=[float(np.median(r)) for r in inc],
        run_medians_candidate_ms=[float(np.median(r)) for r in cand],
        n_boot=n_boot, seed=seed, decision=decision, reason=reason, suspicious=suspicious,
        suspicious_above=suspicious_above, boot_ci_low=boot_low, boot_ci_high=boot_high, run_ci_low=run_low,
        run_ci_high=run_high, run_ci_kind=run_kind,
        method=_STEP_PAIRED_METHOD if logs is not None else Comparison.model_fields["method"].default,
        round_log_ratios=[] if logs is None else [float(x) for x in logs],
    )


# ---------------------------------------------------------------- A/A check ----
def recommend_min_effect(aa_speedups: Sequence[float], *, quantile: float = 0.95) -> float:
    """The effect A/A noise alone reaches at `quantile`: exp(q-th |log speedup|) - 1.

    Symmetric in faster/slower (log), so 1.03x and 0.97x count as the same noise.
    """
    s = np.asarray(aa_speedups, dtype=float)
    if s.size == 0 or np.any(s <= 0) or not np.all(np.isfinite(s)):
        raise ValueError("need positive finite A/A speedups")
    return float(math.expm1(np.quantile(np.abs(np.log(s)), quantile)))


def _split(n_runs: int, scheme: str, rng: random.Random) -> tuple[int, ...]:
    """Indices of half A. 'pairs': one of each consecutive pair (as A B / B A measuring does)."""
    if scheme == "pairs":
        return tuple(2 * k + rng.randrange(2) for k in range(n_runs // 2))
    return tuple(sorted(rng.sample(range(n_runs), n_runs // 2)))


def calibrate_aa(
    runs: Runs,
    *,
    min_effect: float,
    confidence: float,
    n_splits: int = 200,
    seed: int = 0,
    n_boot: int = 1000,
    scheme: Literal["pairs", "random"] = "pairs",
    min_runs: int = 2,
    target_rate: float = 0.05,
) -> AACalibration:
    """False-accept rate of the rule on runs of ONE program, split into two halves many times.

    `runs` in time order. With 'pairs', each consecutive pair of runs gives one run to each
    half (a leftover odd run is dropped), mirroring interleaved measurement so that slow
    drift cancels as it would for a real candidate; 'random' draws any equal split.
    """
    arrays = _as_runs(runs, "A/A")
    if len(arrays) < 2 * min_runs:
        raise ValueError(f"A/A calibration needs at least {2 * min_runs} runs ({min_runs} per half), got {len(arrays)}")
    rng = random.Random(seed)
    n = len(arrays)
    speedups, lows, accepts, seen = [], [], 0, set()
    for i in range(n_splits):
        a_idx = _split(n, scheme, rng)
        used = range(2 * (n // 2)) if scheme == "pairs" else range(n)
        b_idx = tuple(j for j in used if j not in a_idx)
        seen.add(a_idx)
        c = compare([arrays[j] for j in a_idx], [arrays[j] for j in b_idx], min_effect=min_effect,
                    confidence=confidence, n_boot=n_boot, seed=seed + i, min_runs=min_runs)
        speedups.append(c.speedup)
        lows.append(c.ci_low)
        accepts += c.decision == "accept"
    s = np.asarray(speedups)
    p5, p50, p95 = (float(v) for v in np.percentile(s, [5, 50, 95]))
    rec = recommend_min_effect(s)
    far = accepts / n_splits
    ok = min_effect >= rec
    # accept iff ci_low > 1 + m: at most floor(rate * n) splits may lie above the bar
    k = int(math.floor(target_rate * n_splits + 1e-9))
    desc = sorted(lows, reverse=True)
    needed = max(0.0, desc[k] - 1.0) if k < len(desc) else 0.0
    note = (f"{accepts}/{n_splits} A/A splits accepted at min_effect {_pct(min_effect)} "
            f"(A/A speedups p5-p95 {p5:.3f}-{p95:.3f}); noise suggests min_effect >= {_pct(round(rec, 4))}")
    if not ok:
        note += ": the chosen minimum effect is inside the noise"
    return AACalibration(
        n_runs=n, n_splits=n_splits, n_distinct_splits=len(seen), scheme=scheme, min_effect=min_effect,
        confidence=confidence, n_false_accepts=accepts, false_accept_rate=far, speedup_p5=p5, speedup_p50=p50,
        speedup_p95=p95, abs_log_speedup_p95=float(math.log1p(rec)), recommended_min_effect=rec,
        min_effect_ok=ok, target_false_accept_rate=target_rate, min_effect_needed=needed, note=note,
    )
