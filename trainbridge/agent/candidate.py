"""One candidate's lifecycle, as the graph's routers read it.

    planned -> proposed -> validated ---------> measured -> (decided)
                        \\-> validated_dry_run -----------> (decided)
    a model's rejected candidate -> repair (a new candidate, `<base>-r<n>`) -> proposed ...

The decision itself is a ledger event (`CandidateDecided`); after it the state holds no
current candidate. Ids are minted once, by the planner: the n-th repair of `c07-<recipe>`
is `c07-<recipe>-r<n>` whatever the recipe's name contains.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..measure.statistics import Comparison
from .planner import PlanItem


class Stage(str, Enum):
    PLANNED = "planned"
    PROPOSED = "proposed"
    REPAIR = "repair"                         # to be rewritten by the model from its failure
    VALIDATED = "validated"
    VALIDATED_DRY_RUN = "validated_dry_run"   # references only: decided without timing
    MEASURED = "measured"


class Candidate(BaseModel):
    """The candidate the loop is working on. Unknown fields are an error, not a silent drop."""

    model_config = ConfigDict(extra="forbid", use_enum_values=False)

    id: str
    base_id: str = Field(..., description="the id the planner minted; repairs append -r<n> to it")
    item: PlanItem
    stage: Stage
    repairs: int = Field(0, description="repairs this candidate is the result of")
    feedback: str | None = Field(None, description="the failure a repair is asked to fix")
    previous_dir: str | None = Field(None, description="the rejected attempt a repair starts from")
    dir: str | None = Field(None, description="candidates/<id>: program, proposal, harness results")
    source: str | None = Field(None, description="'recipe:<name>' or 'llm:<model>'")
    low_precision: bool = False
    comparison: Comparison | None = None

    @model_validator(mode="before")
    @classmethod
    def _base_id_of_older_checkpoints(cls, data):
        if isinstance(data, dict) and "base_id" not in data and "id" in data:
            data = {**data, "base_id": data["id"]}
        return data

    @classmethod
    def planned(cls, base_id: str, item: PlanItem) -> "Candidate":
        return cls(id=base_id, base_id=base_id, item=item, stage=Stage.PLANNED)

    def repair(self, feedback: str) -> "Candidate":
        """The next attempt at the same plan item, sent back with the failure that rejected this one."""
        n = self.repairs + 1
        return Candidate(id=f"{self.base_id}-r{n}", base_id=self.base_id, item=self.item, stage=Stage.REPAIR,
                         repairs=n, feedback=feedback, previous_dir=self.dir)

    def to_state(self) -> dict:
        """The JSON-able form the checkpointer stores."""
        return self.model_dump(mode="json")
