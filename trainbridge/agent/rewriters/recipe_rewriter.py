"""The offline rewriter: the plan item names a recipe, the recipe rewrites the source."""

from __future__ import annotations

from .base import Declined, Proposal


class RecipeRewriter:
    can_repair = False  # a recipe would write the same program again

    @property
    def transcript(self) -> list:
        return []

    def transcript_json(self) -> str:
        return "[]"

    def repair(self, item, files: dict[str, str], target: str, context: dict, previous: Proposal,
               failure: str) -> Proposal | Declined:
        return Declined(reason="a recipe cannot repair its own program")

    def propose(self, item, files: dict[str, str], target: str, context: dict) -> Proposal | Declined:
        from .recipe_base import off_limits
        from .recipes import RECIPES, NotApplicable

        if getattr(item, "combines", None):
            return self._combine(item, files, target, context)
        recipe = RECIPES.get(item.recipe)
        if recipe is None:
            return Declined(reason=f"no recipe named {item.recipe!r}")
        fence = off_limits(files, context.get("protected"), context.get("editable"))
        out = recipe.apply(files, target, getattr(item, "site", None), protected=fence)
        if isinstance(out, NotApplicable):
            return Declined(reason=out.reason)
        return Proposal(
            source=f"recipe:{recipe.name}",
            files=out.files,
            changed_files=list(out.changed_files),
            description=out.description,
            mechanism=recipe.mechanism,
            notes=list(getattr(out, "notes", []) or []),
            low_precision=recipe.pattern == "precision",
            ops_removed=list(getattr(out, "ops_removed_estimate", []) or []),
        )

    def _combine(self, item, files: dict[str, str], target: str, context: dict) -> Proposal | Declined:
        """Each near miss's recipe applied to the output of the last (`planner.combined_item`); one
        that no longer applies to the incumbent is left out and said so; fewer than two is no
        combination."""
        applied, skipped, notes, ops, low = [], [], [], [], False
        current = dict(files)
        changed: set[str] = set()
        for part in item.combines:
            got = self.propose(part, current, target, context)
            if isinstance(got, Declined):
                skipped.append(f"{part.key} ({got.reason[:160]})")
                continue
            current = got.files
            changed |= set(got.changed_files)
            applied.append(part.key)
            notes += [f"{part.key}: {n}" for n in got.notes]
            ops += got.ops_removed
            low = low or got.low_precision
        if len(applied) < 2:
            return Declined(reason=f"fewer than two near misses still apply to the incumbent: applied "
                                   f"{applied or 'none'}; skipped {skipped}")
        if skipped:
            notes.append(f"left out (no longer applies to the incumbent): {'; '.join(skipped)}")
        return Proposal(source=f"recipe:{item.recipe}", files=current, changed_files=sorted(changed),
                        description=f"near misses measured alone, applied together: {' + '.join(applied)}",
                        mechanism="the changes of " + " + ".join(applied), notes=notes, low_precision=low,
                        ops_removed=ops)
