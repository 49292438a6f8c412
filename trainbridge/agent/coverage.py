"""Which GPU intents the run never took up, and why.

The evidence says what Inductor fused on the GPU (attention at train.py:69-70, a GELU at
line 43, ...); the planner proposes candidates only where a recipe recognises the code. An
intent whose spelling no recipe knows was, before this, simply absent from the run's record:
the user saw "nothing accepted" and not "your attention was never tried". At the end of a run
each intent of a pattern no candidate took up gets one reason:

- no recipe realises the pattern at all, or none on this target (the registry's operator for
  the target is named, for a hand change);
- a recipe for the pattern exists but found no site at the intent's lines: the code there is
  written in a form no recipe recognises (the lines are named: a hand change, or `--agent llm`,
  which is shown those spans);
- a recipe matches those lines but the run's budget ended before it was tried.
"""

from __future__ import annotations

from ..ledger import models as ev
from ..patterns import PATTERNS
from ..workload import ProtectedRegion


NEARBY_LINES = 10
"""A recipe reports the statement it replaces (`y = att @ v`), the evidence the lines whose
operators Inductor fused (`att = q @ k.T ...`, `att.softmax(-1)`): in the same function and
this close, they are one site."""


def _spans(intent: dict) -> list[tuple[str, int, int, str]]:
    return [(s.get("file", ""), int(s.get("start_line", 0)), int(s.get("end_line", s.get("start_line", 0))),
             (s.get("function") or "").split(".")[-1]) for s in intent.get("spans") or []]


def _overlaps(site, spans: list[tuple[str, int, int, str]]) -> bool:
    end = site.end_line or site.line
    for f, a, b, function in spans:
        if site.file != f:
            continue
        if site.line <= b and a <= end:
            return True
        near = site.line - b <= NEARBY_LINES and a - end <= NEARBY_LINES
        if near and function and site.qualname.split(".")[-1] == function:
            return True
    return False


def unrealised_intents(intents: list[dict], proposed: list[ev.CandidateProposed], files: dict[str, str],
                       target: str, *, done_reason: str = "", dry_run: bool = False,
                       protected: list[ProtectedRegion] | None = None) -> list[ev.UnrealisedIntent]:
    """The intents of patterns no proposed candidate took up, each with its reason (see the module)."""
    from .rewriters.recipes import RECIPES

    taken_ids = {p.intent_id for p in proposed if p.intent_id}
    taken_patterns = {p.pattern for p in proposed}
    out: list[ev.UnrealisedIntent] = []
    for intent in intents:
        pattern = intent.get("pattern", "")
        if intent.get("id") in taken_ids or pattern in taken_patterns or pattern in ("other", ""):
            continue
        spans = _spans(intent)
        where = [f"{f}:{a}" + (f"-{b}" if b != a else "") for f, a, b, _ in spans]
        recipes = [r for r in RECIPES.values() if r.pattern == pattern]
        usable = [r for r in recipes if target in r.targets and not (dry_run and not r.dry_run_checkable)]
        if not recipes:
            spec = PATTERNS.get(pattern)
            ops = spec.target_ops.get(target, ()) if spec else ()
            reason = f"no recipe realises {pattern} yet" + (f" (on {target}: {ops[0].api})" if ops else "")
        elif not usable:
            why = next((r.unsupported.get(target) for r in recipes if r.unsupported.get(target)), "")
            reason = f"no recipe for {pattern} on {target}" + (f": {why}" if why else "")
        else:
            sites = [(r.name, s) for r in usable for s in r.find(files, target, protected=protected)]
            here = sorted({name for name, s in sites if _overlaps(s, spans)})
            if here:
                reason = f"{', '.join(here)} matches these lines but was not tried: {done_reason or 'the run ended'}"
            elif not spans:
                reason = (f"{', '.join(r.name for r in usable)} found no site in the program"
                          if not sites else f"{', '.join(sorted({n for n, _ in sites}))} was not tried: "
                          f"{done_reason or 'the run ended'}")
            else:
                reason = (f"no recipe recognised the code at {', '.join(where)} "
                          f"({', '.join(r.name for r in usable)} found "
                          + (f"sites elsewhere only: {', '.join(sorted({f'{s.file}:{s.line}' for _, s in sites}))})"
                             if sites else "no site)")
                          + ": a form the recipes do not know; a hand change, or --agent llm (shown these lines)")
        out.append(ev.UnrealisedIntent(intent_id=str(intent.get("id", pattern)), pattern=pattern, spans=where,
                                       reason=reason))
    return out
