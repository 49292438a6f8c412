"""Static checks on a candidate program, before anything runs.

Each rule refuses, at the source, one attack from docs/measurement_integrity.md (a candidate
that seizes what the harness owns, skips work structurally, or hides a fallback to the
original path), in the manner of KernelBench's static checker: a registry of named rules,
a stated rationale above each, two tiers (`error` refuses the candidate, `warning` is
recorded). Rules compare candidate against original, so a pattern the program already had
(its own seed call, its own try/except, its own `.detach()`) is never held against it.

Public API: `check_candidate(original, candidate, protected, editable, target) -> GuardVerdict`
and `RULES` (rule id -> rationale).

Modules, one job each: `rules` (the rule table and the verdict models), `vocabulary` (the
calls, modules and names the rules recognise), `facts` and `collector` (what one pass over a
source text records), `protected_checks`, `call_checks` and `structure_checks` (the rules,
grouped by what they protect), `check` (the entry point that runs them per changed file).
"""

from .check import check_candidate
from .rules import RULES

__all__ = ["RULES", "check_candidate"]
