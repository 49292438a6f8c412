"""Rank what to try next: intents joined to recipes, scored by the time they could remove.

score = predicted saving (ms, from the target profile, calibrated by what the recipe realised
when measured: `measure.prediction`) x confidence / cost of the ladder level. Cheaper levels
come first at equal score; one mechanism per candidate. Every plan item carries its
hypothesis, written before anything is measured: which operators should disappear, the
predicted saving, and the result that would reject it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..measure.prediction import Observation, calibration
from ..patterns import LEVEL_COST, pattern_spec
from ..profile.analysis import ProfileReport


class Hypothesis(BaseModel):
    ops_removed: list[str] = Field(..., description="operators expected to disappear or shrink")
    compiled_region: bool = Field(False, description="the change is a torch.compile region: a compiled graph must "
                                                     "be entered inside the training step")
    gemm_precision: Literal["lower", "higher"] | None = Field(
        None, description="a precision change: more ('lower') or fewer ('higher') of the step's GEMM/convolution "
                          "ops must run in a 16-bit dtype")
    predicted_saving_ms: float = Field(..., description="calibrated: the raw prediction x the recipe's realised factor")
    predicted_saving_pct: float
    uncalibrated_saving_ms: float | None = Field(None, description="profiled time of what the change touches x the "
                                                 "pattern's removable share, capped by the time above the floor")
    calibration: str = Field("", description="the factor applied and the measurements it comes from")
    reject_if: str


class PlanItem(BaseModel):
    key: str = Field(..., description="recipe@intent: what makes a plan item already tried")
    recipe: str
    pattern: str
    level: str
    gap_class: str
    site: str | None = Field(None, description="function qualname, for recipes applied one site at a time")
    intent_id: str | None = None
    intent_summary: str = ""
    confidence: float
    score: float
    hypothesis: Hypothesis
    combines: list["PlanItem"] = Field(default_factory=list, description="for a combined item: the near misses "
                                       "it applies one after the other, each validated and measured alone before")


PlanItem.model_rebuild()

COMBINED = "combined"


def combined_item(near_misses: list[PlanItem], *, min_effect: float) -> PlanItem | None:
    """One candidate of every near miss so far (issue 22's combined search), or None for fewer than two.

    A near miss is a recipe candidate that passed validation alone and was measured faster, but
    whose interval did not clear the bar: several small real gains can each sit below what the
    clock resolves, while their sum does not. Its hypothesis is the union of theirs: the
    operators any of them removes must fall (a compiled region's or a precision change's own
    check was passed alone, and op counting runs eager); the predicted saving is their sum.
    """
    parts = list({i.key: i for i in near_misses if not i.combines}.values())
    if len(parts) < 2:
        return None
    ops = sorted({op for i in parts for op in i.hypothesis.ops_removed})
    compiled = all(i.hypothesis.compiled_region for i in parts)
    precision = next((i.hypothesis.gemm_precision for i in parts if i.hypothesis.gemm_precision), None) \
        if all(i.hypothesis.gemm_precision or i.hypothesis.compiled_region for i in parts) else None
    saving = sum(i.hypothesis.predicted_saving_ms for i in parts)
    pct = sum(i.hypothesis.predicted_saving_pct for i in parts)
    names = " + ".join(i.key for i in parts)
    hyp = Hypothesis(ops_removed=[] if compiled or precision else ops, compiled_region=compiled,
                     gemm_precision=precision, predicted_saving_ms=round(saving, 3), predicted_saving_pct=round(pct, 2),
                     uncalibrated_saving_ms=round(sum(i.hypothesis.uncalibrated_saving_ms or 0.0 for i in parts), 3),
                     calibration="the sum of its parts' calibrated predictions",
                     reject_if=f"the speedup's 95% CI does not clear {1 + min_effect:.2f}x, or the named operators' "
                               "per-step count does not fall, or the loss trajectory leaves tolerance")
    return PlanItem(key=f"{COMBINED}:" + "+".join(sorted(i.key for i in parts)), recipe=COMBINED, pattern=COMBINED,
                    level=max((i.level for i in parts), key=lambda lv: LEVEL_COST.get(lv, 9)), gap_class=COMBINED,
                    intent_summary=f"near misses measured alone, applied together: {names}",
                    confidence=min(i.confidence for i in parts), score=sum(i.score for i in parts),
                    hypothesis=hyp, combines=parts)


def predicted_saving_ms(pattern: str, profile: ProfileReport, op_estimate: list[str] | None = None) -> float:
    spec = pattern_spec(pattern)
    ops, fraction = spec.eager_ops, spec.removable_share
    names = set(ops) | {f"aten::{o.split('.')[-1]}" if "::" not in o else o for o in (op_estimate or [])}
    by_name = {o.name: o for o in (profile.all_ops or profile.top_ops)}
    spent = sum(by_name[n].self_ms_per_step for n in names if n in by_name)
    if pattern == "precision":
        spent = profile.gemm_share * profile.op_self_ms_per_step
    if pattern == "compile_model":
        # the whole model compiled: its elementwise passes fuse and Python dispatch goes
        spent = profile.outside_ops_ms_per_step + profile.elementwise_share * profile.op_self_ms_per_step
        fraction = 0.4
    elif pattern in ("threads", "compile_region") or spent == 0:
        # No operator to point at: the L0/L4 mechanisms act on dispatch/outside-operator time.
        spent = profile.outside_ops_ms_per_step + 0.1 * profile.op_self_ms_per_step
        fraction = 0.2
    saving = spent * fraction
    if profile.floor is not None and pattern != "precision":
        # A rewrite at the port's precision cannot take the step below its floor: it removes
        # time above it (elementwise passes, other operators, dispatch), so it saves at most that.
        # (A precision change moves the floor itself.)
        exposed = sum(max(v, 0.0) for k, v in profile.floor.above_floor_ms.items() if k != "matrix")
        saving = min(saving, exposed)
    return saving


def site_pattern(pattern: str, site: str | None) -> str:
    """The pattern a compile_region site stands for (its function's name says which)."""
    if pattern != "compile_region" or not site:
        return pattern
    low = site.lower()
    for key, pat in (("newtonschulz", "optimizer_update"), ("zeropower", "optimizer_update"), ("rotary", "rotary"),
                     ("rope", "rotary"), ("norm", "rms_norm"), ("mlp", "relu2"), ("swiglu", "swiglu"),
                     ("softcap", "softcap_cross_entropy")):
        if key in low:
            return pat
    return pattern


def make_item(recipe, profile: ProfileReport, *, intent: dict | None, min_effect: float,
              site: str | None = None, target: str | None = None, observed: list[Observation] = ()) -> PlanItem:
    pattern = site_pattern(recipe.pattern, site)
    ops = pattern_spec(pattern).eager_ops
    raw = predicted_saving_ms(pattern, profile, (intent or {}).get("eager_ops"))
    cal = calibration(recipe.name, target or "cpu", list(observed))
    saving = raw * cal.factor
    step = profile.step.median_ms
    conf = float((intent or {}).get("confidence", 0.5))
    level = (intent or {}).get("level") or recipe.level
    pct = 100 * saving / step if step else 0.0
    compiled = target in getattr(recipe, "compiled_on", ())
    precision = getattr(recipe, "gemm_precision", None)
    if compiled:
        mechanism = "no compiled graph is entered inside the training step"
    elif precision:
        mechanism = ("the step's GEMM/convolution ops do not move to a 16-bit dtype" if precision == "lower"
                     else "fewer of the step's GEMM/convolution ops run in a 16-bit dtype")
    else:
        mechanism = "the named operators' per-step count does not fall"
    hyp = Hypothesis(
        ops_removed=[] if compiled or precision else list(ops), compiled_region=compiled, gemm_precision=precision,
        predicted_saving_ms=round(saving, 3),
        predicted_saving_pct=round(pct, 2),
        uncalibrated_saving_ms=round(raw, 3),
        calibration=cal.note,
        reject_if=(f"the speedup's {int(100 * 0.95)}% CI does not clear {1 + min_effect:.2f}x, or {mechanism}, "
                   "or the loss trajectory leaves tolerance"),
    )
    return PlanItem(
        key=recipe.name + (f":{site}" if site else ""),
        recipe=recipe.name, site=site, pattern=recipe.pattern, level=recipe.level, gap_class=recipe.gap_class,
        intent_id=(intent or {}).get("id"), intent_summary=(intent or {}).get("summary", ""),
        confidence=conf, score=saving * conf / LEVEL_COST.get(level, 2.0), hypothesis=hyp,
    )


def candidate_hypothesis(item: PlanItem, source: str, target: str, *, ops_claimed: list[str] = (),
                         lowers_precision: bool = False) -> Hypothesis:
    """The mechanism a candidate is checked against: the one its *own* change claims.

    A recipe candidate carries its plan item's hypothesis. A model may realise an item with
    another recipe (`llm:<model>+recipe:<name>`): that recipe's mechanism is checked (an SDPA
    candidate proposed for a precision item moves no GEMM to bf16, and must not be asked to).
    A model's own edit is checked against the operators the model said it removes, and against
    the GEMM dtypes only when it changed precision.
    """
    from .rewriters.recipes import RECIPES

    h = item.hypothesis
    name = source.rpartition("recipe:")[2] if "recipe:" in source else None
    if name == item.recipe:
        return h
    if name is None:
        return h.model_copy(update={"ops_removed": list(ops_claimed) or h.ops_removed,
                                    "gemm_precision": h.gemm_precision if lowers_precision else None})
    recipe = RECIPES[name]
    compiled = target in recipe.compiled_on
    precision = recipe.gemm_precision
    ops = [] if compiled or precision else list(ops_claimed) or list(pattern_spec(recipe.pattern).eager_ops)
    return h.model_copy(update={"ops_removed": ops, "compiled_region": compiled, "gemm_precision": precision})


def rank(items: list[PlanItem]) -> list[PlanItem]:
    return sorted(items, key=lambda i: (-i.score, LEVEL_COST.get(i.level, 9)))
