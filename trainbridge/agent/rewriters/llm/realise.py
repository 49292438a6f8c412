"""Turning a parsed answer into a candidate program (a Proposal), or saying exactly why not.

An answer names a library recipe or carries search-and-replace edits. Either is applied here;
the result must change the program and, when the context carries the manifest, pass the static
guard. Each failure is a `RealiseFailure` with its stage (recipe, apply, guard) and a message
precise enough to send back to the model as a repair request. `lowers_precision` decides
whether a change lowers math precision; the planner uses it on any candidate too.
"""

from __future__ import annotations

import difflib
import re

from ..base import Declined, Proposal
from ..edits import EditError, apply_edits
from .answer import LLMAnswer
from .context import guard_spec


class RealiseFailure(Exception):
    """An answer that could not become a candidate: `stage` is recipe, apply or guard."""

    def __init__(self, stage: str, message: str):
        super().__init__(message)
        self.stage, self.message = stage, message


def realise(answer: LLMAnswer, item, incumbent, base, target, context, model: str) -> Proposal | Declined:
    """The candidate the answer describes, guard-checked; RealiseFailure when it cannot be built."""
    notes = [f"intent addressed: {answer.intent_addressed}",
             f"model hypothesis: removes {', '.join(answer.hypothesis.ops_removed) or 'nothing named'}; "
             f"saves {answer.hypothesis.predicted_saving_pct:g} %; reject if {answer.hypothesis.reject_if}"]
    if answer.recipe:
        from ..recipes import RECIPES, NotApplicable

        recipe = RECIPES.get(answer.recipe)
        if recipe is None:
            raise RealiseFailure("recipe", f"no recipe named {answer.recipe!r}; the library has: "
                                           f"{', '.join(sorted(RECIPES))}")
        if target not in recipe.targets:
            raise RealiseFailure("recipe", f"recipe {recipe.name!r} does not support target {target!r} "
                                           f"(supports {', '.join(sorted(recipe.targets))})")
        site = getattr(item, "site", None) if recipe.name == getattr(item, "recipe", None) else None
        from ..recipe_base import off_limits

        fence = off_limits(incumbent, context.get("protected"), context.get("editable"))
        out = recipe.apply(incumbent, target, site, protected=fence)
        if isinstance(out, NotApplicable):
            raise RealiseFailure("recipe", f"recipe {recipe.name!r} does not apply: {out.reason}")
        new, mechanism = out.files, recipe.mechanism
        source = f"llm:{model}+recipe:{recipe.name}"
        description = out.description
        notes = [f"recipe {recipe.name} chosen by llm:{model}", *notes, *(out.notes or [])]
        low = recipe.pattern == "precision"
        ops = list(answer.hypothesis.ops_removed or out.ops_removed_estimate or [])
    elif answer.edits:
        try:
            new, _ = apply_edits(base, answer.edits)
        except EditError as e:
            raise RealiseFailure("apply", str(e)) from None
        mechanism = answer.mechanism or f"{item.pattern}: {answer.intent_addressed}"
        source = f"llm:{model}"
        description = ""
        low = item.pattern == "precision" or lowers_precision(incumbent, new)
        ops = list(answer.hypothesis.ops_removed)
    else:
        return Declined(reason=f"llm:{model} proposed no change: {answer.intent_addressed}")
    changed = [rel for rel in new if new[rel] != incumbent.get(rel)]
    if not changed:
        raise RealiseFailure("apply", "the change leaves the incumbent program exactly as it was")
    spec = guard_spec(context)
    if spec is not None:
        from ...guard import check_candidate

        original = context.get("original") or incumbent
        verdict = check_candidate(original, new, spec[0], spec[1], target)
        if not verdict.passed:
            raise RealiseFailure("guard", "\n".join(f"{v.rule} at {v.file}:{v.line}: {v.message}"
                                                    for v in verdict.violations if v.severity == "error"))
    return Proposal(source=source, files=new, changed_files=changed,
                    description=description or f"{mechanism} in {', '.join(changed)}", mechanism=mechanism,
                    notes=notes, low_precision=low, ops_removed=ops)


_PRECISION = re.compile(r"bfloat16|float16|\.half\(|allow_tf32|allow_hf32|allow_bf16|allow_fp16|"
                        r"set_float32_matmul_precision|autocast")


def lowers_precision(before: dict[str, str], after: dict[str, str]) -> bool:
    """The edits add a line that lowers math precision (bf16/fp16 casts, autocast, TF32/HF32)."""
    for rel in after:
        a, b = before.get(rel, "").splitlines(), after[rel].splitlines()
        removed, added = set(), []
        for ln in difflib.unified_diff(a, b, lineterm="", n=0):
            if ln.startswith("-") and not ln.startswith("---"):
                removed.add(ln[1:].strip())
            elif ln.startswith("+") and not ln.startswith("+++"):
                added.append(ln[1:].strip())
        if any(_PRECISION.search(x) and x not in removed for x in added):
            return True
    return False
