"""The record authors' own NPU figures: each record's direct port and optimized version.

Published for 20 records (8x Ascend 910C, training minutes). `records run` shows them beside
our figures, which come from another machine, another scale and another target: the two are
shown side by side and never divided by each other.
"""

from __future__ import annotations

import csv
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, Field


class PublishedNpuPair(BaseModel):
    num: int
    direct_port_min: float = Field(..., description="training minutes of the direct NPU port")
    optimized_min: float = Field(..., description="training minutes of the authors' optimized NPU version")
    source: str

    @property
    def speedup(self) -> float:
        return self.direct_port_min / self.optimized_min


@lru_cache(maxsize=1)
def published_pairs() -> dict[int, PublishedNpuPair]:
    path = Path(__file__).with_name("npu_published.tsv")
    with path.open(newline="", encoding="utf-8") as fh:
        rows = [PublishedNpuPair.model_validate(r) for r in csv.DictReader(fh, delimiter="\t")]
    return {r.num: r for r in rows}
