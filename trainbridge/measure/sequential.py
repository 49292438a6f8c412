"""Group-sequential acceptance: more pairs for a candidate whose interval straddles the bar.

Looking at a result again and again until it clears the bar inflates the false-accept rate;
a group-sequential rule spends the allowed rate over the looks instead. Each look adds one
session of pairs (equal information per look). With `looks` K and an overall one-sided
false-accept rate alpha, the boundaries c_1..c_K on the cumulative z-statistic are the ones
whose crossing probabilities, when the true speedup sits exactly on the bar, add up to what
the Lan-DeMets spending function allows by each look:

    P(Z_1 <= c_1, ..., Z_(k-1) <= c_(k-1), Z_k > c_k) = a(k/K) - a((k-1)/K),

with corr(Z_i, Z_j) = sqrt(i/j) (i <= j), computed with scipy's multivariate normal. Those
levels assume a known variance; the loop estimates it from a handful of pairs (a t-interval
with 2 degrees of freedom at the first look of 3 pairs), which lets the z-levels cross about
16% more often than alpha. So the per-look levels 1 - Phi(c_k) are scaled down by one factor
until the t-statistics of simulated looks (fixed seed, 200,000 draws, the plan's pair counts)
cross at exactly alpha: that simulated rate is the rule's computed error rate. Look k judges
all pairs so far at its level (a two-sided interval of confidence 1 - 2 level, the form
`statistics.compare` takes). Stopping early for futility (the point estimate short of half
the bar) only removes accepts, so the overall rate stays at most alpha;
`simulated_false_accept_rate` checks the whole rule with futility on fresh draws.

Spending: Pocock-type a(t) = alpha ln(1 + (e - 1) t) spends evenly, so a clear gain is taken
at the first look; O'Brien-Fleming-type a(t) = 2 - 2 Phi(z_(alpha/2) / sqrt t) keeps almost
all of alpha for the last look.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field
from scipy import optimize, stats

Spending = Literal["pocock", "obrien_fleming"]


class SequentialPlan(BaseModel):
    """The looks of one candidate's timing and the level each is judged at."""

    looks: int = Field(..., ge=1, description="sessions of pairs at most (the cap)")
    alpha_one_sided: float = Field(..., gt=0, lt=0.5, description="overall false-accept rate at the bar")
    spending: Spending
    pairs_per_look: int = Field(..., ge=2)
    boundaries_z: list[float] = Field(..., description="c_k on the cumulative z-statistic, per look")
    t_scale: float = Field(..., description="factor on the z-levels that brings the t-looks' rate to alpha")
    nominal_alpha: list[float] = Field(..., description="one-sided level each look is judged at (t-interval)")
    computed_alpha: float = Field(..., description="simulated rate of crossing any look at the bar")

    def confidence_at(self, look: int) -> float:
        """Two-sided confidence of the interval judged at 1-based `look`."""
        return 1.0 - 2.0 * self.nominal_alpha[look - 1]

    def describe(self, look: int) -> str:
        return (f"group-sequential look {look}/{self.looks} ({self.spending} spending, one-sided false-accept "
                f"rate {self.alpha_one_sided:g} over all looks; this look at {self.nominal_alpha[look - 1]:.4f})")


def spent(alpha: float, t: float, spending: Spending) -> float:
    """The false-accept rate a spending function allows by information fraction t."""
    if t <= 0:
        return 0.0
    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    return 2.0 - 2.0 * float(stats.norm.cdf(stats.norm.ppf(1 - alpha / 2) / math.sqrt(t)))


def _no_crossing(bounds: list[float]) -> float:
    """P(Z_1 <= c_1, ..., Z_k <= c_k) for the cumulative z-statistics of equal-sized looks."""
    k = len(bounds)
    if k == 1:
        return float(stats.norm.cdf(bounds[0]))
    idx = np.arange(1, k + 1)
    cov = np.sqrt(np.minimum.outer(idx, idx) / np.maximum.outer(idx, idx))
    mvn = stats.multivariate_normal(mean=np.zeros(k), cov=cov, seed=0, maxpts=200_000 * k, abseps=1e-7, releps=1e-7)
    return float(mvn.cdf(np.asarray(bounds)))


def _t_crossing_rate(levels: list[float], pairs_per_look: int, draws: np.ndarray) -> float:
    """How often the paired t-statistic crosses any look's one-sided level under no effect."""
    crossed = np.zeros(draws.shape[0], bool)
    for k, level in enumerate(levels, start=1):
        x = draws[:, : k * pairs_per_look]
        n = x.shape[1]
        t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(n))
        crossed |= t > stats.t.isf(level, n - 1)
    return float(crossed.mean())


@lru_cache(maxsize=32)
def _plan(looks: int, alpha: float, spending: Spending, pairs_per_look: int) -> SequentialPlan:
    bounds: list[float] = []
    for k in range(1, looks + 1):
        target = spent(alpha, k / looks, spending) - spent(alpha, (k - 1) / looks, spending)
        before = _no_crossing(bounds) if bounds else 1.0

        def excess(c: float) -> float:
            # P(no crossing before k, crossing at k) - what look k may spend
            return (before - _no_crossing([*bounds, c])) - target
        bounds.append(float(optimize.brentq(excess, 0.0, 10.0, xtol=1e-6)))
    z_levels = [float(stats.norm.sf(c)) for c in bounds]
    if looks == 1:  # one t-test: exact at its level
        scale, rate, z_levels = 1.0, alpha, [alpha]
    else:
        draws = np.random.default_rng(20261206).standard_normal((200_000, looks * pairs_per_look))
        scale = float(optimize.brentq(
            lambda f: _t_crossing_rate([f * a for a in z_levels], pairs_per_look, draws) - alpha, 1e-3, 1.0,
            xtol=1e-4))
        rate = _t_crossing_rate([scale * a for a in z_levels], pairs_per_look, draws)
    return SequentialPlan(looks=looks, alpha_one_sided=alpha, spending=spending, pairs_per_look=pairs_per_look,
                          boundaries_z=bounds, t_scale=scale, nominal_alpha=[scale * a for a in z_levels],
                          computed_alpha=rate)


def plan(looks: int, confidence: float, pairs_per_look: int, spending: Spending = "pocock") -> SequentialPlan:
    """The plan for `looks` looks of `pairs_per_look` pairs whose overall one-sided false-accept
    rate is what one look at `confidence` has."""
    if pairs_per_look < 2:
        raise ValueError("a look needs at least 2 pairs to see run-to-run noise")
    return _plan(looks, round((1.0 - confidence) / 2, 12), spending, pairs_per_look)


def keep_looking(speedup, ci_low, ci_high, bar: float):
    """Whether an undecided look earns another: the interval straddles the bar and the point
    estimate is at least half-way to it (below that, more pairs would rarely clear it).
    Floats give a bool, arrays (the simulation's looks) an array."""
    return (ci_low <= 1 + bar) & (1 + bar < ci_high) & (speedup > 1 + bar / 2)


class OperatingPoint(BaseModel):
    """How the rule behaves at one true speedup, by simulation: how often it accepts, and how
    many pairs (rounds) it takes on average."""

    effect: float = Field(..., description="true fractional speedup (0.02 = 2% faster)")
    accept_rate: float
    mean_pairs: float


def operating_point(p: SequentialPlan, *, sd_log: float, bar: float, effect: float,
                    sims: int = 20_000, seed: int = 0) -> OperatingPoint:
    """The rule at a true speedup of `1 + effect`: each pair's (round's) log ratio ~
    Normal(log(1 + effect), sd_log), the run-level t-interval at each look's level, futility as
    `keep_looking`. (The loop also requires the bootstrap interval to clear, which can only
    remove accepts.)"""
    pairs_per_look = p.pairs_per_look
    rng = np.random.default_rng(seed)
    d = rng.normal(math.log1p(effect), sd_log, size=(sims, p.looks * pairs_per_look))
    alive = np.ones(sims, bool)
    accepted = np.zeros(sims, bool)
    pairs = np.zeros(sims)
    for k in range(1, p.looks + 1):
        x = d[:, : k * pairs_per_look]
        n = x.shape[1]
        pairs += alive * pairs_per_look
        mean, se = x.mean(1), x.std(1, ddof=1) / math.sqrt(n)
        half = stats.t.ppf(1 - p.nominal_alpha[k - 1], n - 1) * se
        low, high = np.exp(mean - half), np.exp(mean + half)
        acc = alive & (low > 1 + bar)
        accepted |= acc
        more = keep_looking(np.exp(mean), low, high, bar)
        alive &= ~acc & more
    return OperatingPoint(effect=effect, accept_rate=float(accepted.mean()), mean_pairs=float(pairs.mean()))


def minimum_detectable_effect(p: SequentialPlan, *, sd_log: float, bar: float, power: float = 0.8,
                              sims: int = 20_000, seed: int = 0) -> float:
    """The smallest true speedup the rule accepts with probability `power`, for rounds whose
    log ratios scatter by `sd_log` (bisection on `operating_point`, common random numbers)."""
    lo, hi = bar, bar + 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if operating_point(p, sd_log=sd_log, bar=bar, effect=mid, sims=sims, seed=seed).accept_rate >= power:
            hi = mid
        else:
            lo = mid
    return hi


def simulated_false_accept_rate(p: SequentialPlan, *, sd_log: float, bar: float,
                                sims: int = 20_000, seed: int = 0) -> float:
    """The rule's false-accept rate by simulation when the true speedup is exactly the bar
    (`operating_point` there)."""
    return operating_point(p, sd_log=sd_log, bar=bar, effect=bar, sims=sims, seed=seed).accept_rate
