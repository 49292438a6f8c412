"""What every rewriter returns to the loop, whether a recipe or a language model wrote it."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field


class Proposal(BaseModel):
    """A complete candidate program: one mechanism, with where and why."""

    source: str = Field(..., description="'recipe:<name>' or 'llm:<model>'")
    files: dict[str, str] = Field(..., description="relative path -> full new source")
    changed_files: list[str]
    description: str
    mechanism: str
    notes: list[str] = Field(default_factory=list)
    low_precision: bool = Field(False, description="the change lowers math precision (dtype-aware tolerance)")
    ops_removed: list[str] = Field(default_factory=list)


class Declined(BaseModel):
    reason: str


class Rewriter(Protocol):
    """What the loop asks of a rewriter: a first program for a plan item, and a repaired one
    after the loop rejected the previous attempt (`can_repair` says whether it can)."""

    can_repair: bool

    @property
    def transcript(self) -> list:
        """Exchanges with a model so far, oldest first (empty for the recipes)."""
        ...

    def transcript_json(self) -> str: ...

    def propose(self, item, files: dict[str, str], target: str, context: dict) -> Proposal | Declined: ...

    def repair(self, item, files: dict[str, str], target: str, context: dict, previous: Proposal,
               failure: str) -> Proposal | Declined: ...
