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
    def propose(self, item, files: dict[str, str], target: str, context: dict) -> Proposal | Declined: ...
