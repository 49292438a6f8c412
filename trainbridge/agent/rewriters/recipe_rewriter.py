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
