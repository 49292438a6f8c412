"""The optimization vocabulary and the pattern registry every stage reads."""

from .registry import PATTERNS, UNKNOWN, PatternSpec, TargetOp, pattern_spec
from .vocabulary import LEVEL_COST, LEVELS, GapClass, Level, Pattern, level_rank

__all__ = ["PATTERNS", "UNKNOWN", "PatternSpec", "TargetOp", "pattern_spec", "LEVEL_COST", "LEVELS", "GapClass",
           "Level", "Pattern", "level_rank"]
