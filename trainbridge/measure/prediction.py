"""Predict, then measure: calibrated predicted savings, and the check of each against its measurement.

The planner's raw prediction for a recipe is the profiled time of the operators it changes
times the pattern's removable share (`patterns.registry`), capped by the time above the floor.
Measured, those shares were guesses: on the others-programs benchmark `fused_optimizer`
predicted 16.6% of a step and measured 3.3%, `rms_norm_fused` predicted 9.9% and measured a
slowdown. So a prediction is scaled by what its recipe *realised* on this target: the ratio of
measured saving to raw prediction, over the candidates measured so far. Two sources, in order:

- the shipped table (`realised_shares.json`, written by `benchmarks/predictions.py` from the
  ledgers it reads, with the CPU they ran on; `$TRAINBRIDGE_REALISED_SHARES` names another),
  counted as at most `SHIPPED_WEIGHT` measurements;
- this run's own measured candidates, added as each one is decided, so a recipe that
  disappointed at one site ranks lower at the next.

A recipe not in the table starts from the median factor of the recipes measured on its
target (raw predictions overstate most recipes, so an unmeasured one is not favoured for
being unmeasured); a target with no measurement at all keeps raw predictions (factor 1).
The ratio of one candidate is clipped to [`RATIO_MIN`, `RATIO_MAX`]: a tiny raw prediction
over a noisy measurement would otherwise dominate the mean.

`PredictionCheck` is the other half of the method: the prediction beside the measurement, in
% of the incumbent's step, flagged when it lies more than `FAR_POINTS` outside the measured
interval, faster or slower.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from pydantic import BaseModel, Field

from .statistics import Comparison

SHIPPED_PATH = Path(__file__).with_name("realised_shares.json")
ENV = "TRAINBRIDGE_REALISED_SHARES"  # another table (e.g. fitted on your own ledgers) in place of the shipped one
SHIPPED_WEIGHT = 2.0  # two of this run's own measurements outweigh the shipped table
UNCALIBRATED_WEIGHT = 1.0  # with no table entry, the prior (typical factor, or 1) counts as one measurement
RATIO_MIN, RATIO_MAX = -1.0, 2.0
MIN_RAW_MS = 0.05  # a raw prediction below this says nothing about a ratio
FAR_POINTS = 2.0


def saving_pct(speedup: float) -> float:
    """The share of the incumbent's step a speedup removes, in %."""
    return 100.0 * (1.0 - 1.0 / speedup)


class Observation(BaseModel):
    """One measured recipe candidate: what was predicted before calibration, what it saved."""

    recipe: str
    target: str
    raw_saving_ms: float = Field(..., description="the uncalibrated prediction, ms a step")
    measured_saving_ms: float = Field(..., description="incumbent median step x (1 - 1 / speedup)")
    source: str = Field("", description="candidate id, with its program or run where known")

    @property
    def ratio(self) -> float | None:
        if self.raw_saving_ms < MIN_RAW_MS:
            return None
        return min(max(self.measured_saving_ms / self.raw_saving_ms, RATIO_MIN), RATIO_MAX)

    @classmethod
    def of(cls, recipe: str, target: str, raw_saving_ms: float, comp: Comparison, source: str = "") -> Observation:
        return cls(recipe=recipe, target=target, raw_saving_ms=raw_saving_ms, source=source,
                   measured_saving_ms=comp.median_incumbent_ms * saving_pct(comp.speedup) / 100.0)


class RealisedShare(BaseModel):
    """What one recipe realised of its raw prediction on one target, over the measured candidates."""

    recipe: str
    target: str
    factor: float = Field(..., description="mean of the clipped ratios measured / raw prediction")
    n: int
    ratios: list[float] = Field(..., description="every candidate's clipped ratio, in the order read")
    sources: list[str] = Field(default_factory=list)


class ShippedShares(BaseModel):
    """The table shipped with the package: measured, with the machine and command named."""

    cpu: str = Field(..., description="cpu_signature of the machine the ledgers were measured on")
    date: str
    command: str
    ledgers: list[str]
    shares: list[RealisedShare]

    def get(self, recipe: str, target: str) -> RealisedShare | None:
        return next((s for s in self.shares if s.recipe == recipe and s.target == target), None)

    def typical(self, target: str) -> tuple[float, int] | None:
        """The median factor of the recipes measured on `target`, and how many: the prior of a
        recipe not measured yet (raw predictions overstate most recipes, an unmeasured one too)."""
        factors = sorted(s.factor for s in self.shares if s.target == target)
        if not factors:
            return None
        mid = len(factors) // 2
        return (factors[mid] if len(factors) % 2 else (factors[mid - 1] + factors[mid]) / 2), len(factors)


def fit(observations: list[Observation]) -> list[RealisedShare]:
    """One RealisedShare per (recipe, target) with at least one usable ratio."""
    groups: dict[tuple[str, str], list[Observation]] = {}
    for o in observations:
        if o.ratio is not None:
            groups.setdefault((o.recipe, o.target), []).append(o)
    return [RealisedShare(recipe=r, target=t, factor=sum(o.ratio for o in obs) / len(obs), n=len(obs),
                          ratios=[round(o.ratio, 4) for o in obs], sources=[o.source for o in obs])
            for (r, t), obs in sorted(groups.items())]


@functools.lru_cache(maxsize=4)
def _load(path: str) -> ShippedShares | None:
    p = Path(path)
    return ShippedShares.model_validate_json(p.read_text()) if p.exists() else None


def shipped(path: Path | None = None) -> ShippedShares | None:
    """The table in use: `path`, else $TRAINBRIDGE_REALISED_SHARES, else the one shipped."""
    return _load(str(path or os.environ.get(ENV) or SHIPPED_PATH))


class Calibration(BaseModel):
    """The factor a raw prediction is scaled by, and where it came from (it goes into the ledger)."""

    factor: float
    shipped_n: int = 0
    run_n: int = 0
    note: str


def calibration(recipe: str, target: str, observed: list[Observation] = (),
                table: ShippedShares | None = None) -> Calibration:
    """Shrink this run's ratios for `recipe` on `target` toward the shipped factor (or toward 1)."""
    table = shipped() if table is None else table
    entry = table.get(recipe, target) if table else None
    own = [o.ratio for o in observed if o.recipe == recipe and o.target == target and o.ratio is not None]
    typical = table.typical(target) if table else None
    if entry is not None:
        w0, f0 = min(float(entry.n), SHIPPED_WEIGHT), entry.factor
        said = f"shipped {entry.factor:.2f} over {entry.n} measured on {table.cpu}"
    elif typical is not None:
        w0, f0 = UNCALIBRATED_WEIGHT, typical[0]
        said = (f"no shipped measurement of {recipe} on {target}: the median of the {typical[1]} recipes "
                f"measured there, {typical[0]:.2f}")
    else:
        w0, f0 = UNCALIBRATED_WEIGHT, 1.0
        said = f"no shipped measurement of {recipe} on {target} (factor 1)"
    f = (w0 * f0 + sum(own)) / (w0 + len(own))
    if own:
        said += f"; this run's {len(own)}: " + ", ".join(f"{r:.2f}" for r in own)
    return Calibration(factor=round(f, 4), shipped_n=entry.n if entry else 0, run_n=len(own),
                       note=f"x{f:.2f} ({said})")


class PredictionCheck(BaseModel):
    """The hypothesis' predicted saving against the measured one, in % of the incumbent's step."""

    predicted_pct: float
    predicted_ms: float
    measured_pct: float
    measured_low_pct: float
    measured_high_pct: float
    measured_ms: float
    missed_by_pct: float = Field(0.0, description="predicted minus the nearest end of the measured interval; "
                                                  "0 inside it")
    far: bool = Field(False, description=f"the prediction lies more than {FAR_POINTS} points outside the measured "
                                         "interval (faster or slower than predicted)")

    @classmethod
    def of(cls, predicted_ms: float, comp: Comparison) -> PredictionCheck:
        lo, hi = saving_pct(comp.ci_low), saving_pct(comp.ci_high)
        p = 100.0 * predicted_ms / comp.median_incumbent_ms if comp.median_incumbent_ms else 0.0
        missed = p - hi if p > hi else (p - lo if p < lo else 0.0)
        return cls(predicted_pct=p, predicted_ms=predicted_ms, measured_pct=saving_pct(comp.speedup),
                   measured_low_pct=lo, measured_high_pct=hi,
                   measured_ms=comp.median_incumbent_ms * saving_pct(comp.speedup) / 100.0, missed_by_pct=missed,
                   far=abs(missed) > FAR_POINTS)

    def sentence(self) -> str:
        said = (f"predicted {self.predicted_pct:.1f}% ({self.predicted_ms:.2f} ms a step); measured "
                f"{self.measured_pct:.1f}% ({self.measured_ms:.2f} ms; interval {self.measured_low_pct:.1f}% to "
                f"{self.measured_high_pct:.1f}%)")
        if self.missed_by_pct == 0.0:
            return said + ": the prediction is inside the measured interval"
        way = "over" if self.missed_by_pct > 0 else "under"
        flag = "**far from its prediction**: " if self.far else ""
        return said + f": {flag}the prediction missed, {way}stated by {abs(self.missed_by_pct):.1f} points"
