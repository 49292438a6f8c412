"""What a port produces: its changes, its blockers and the ported files.

The naive port (`port_transformer.py`, driven by `port_source.py`) and the feature porters
(`features/`) all report in these models, and the harness reads them; they live apart so
that importing them needs neither libcst nor the porters.
"""

from __future__ import annotations

import warnings
from typing import Literal

from pydantic import BaseModel, Field

from .registry import TargetName

PortTarget = TargetName

ChangeKind = Literal["device", "cuda_api", "memory_stat", "backend", "pin_memory", "compile_removed",
                     "precision_lost", "precision", "import", "gpu_only_feature",
                     # GPU-only features replaced by targets/features/ (each a reviewed edit)
                     "distributed", "world_size", "assert_dropped", "compiler_config", "attention_replaced",
                     "kernel_replaced", "fp8_to_16bit", "shim_added", "eager_autograd", "unsigned_shift"]


class PortChange(BaseModel):
    file: str
    line: int
    kind: ChangeKind
    before: str
    after: str
    semantic_change: bool = False
    note: str = ""


# `construct` is the word for what was found; pydantic warns that it shadows the deprecated
# BaseModel.construct classmethod, which nothing here calls.
warnings.filterwarnings("ignore", message='Field name "construct" in "PortBlocker"', category=UserWarning)


class PortBlocker(BaseModel):
    """A construct the port found and cannot make run on the target."""

    file: str
    line: int
    construct: str = Field(..., description="what was found, e.g. 'Triton kernel _foo_kernel (launched by bar)'")
    reason: str = Field(..., description="why it cannot be ported (no catalog entry, check failed ...)")

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.construct}: {self.reason}"


class PortResult(BaseModel):
    target: PortTarget
    files: dict[str, str]
    changes: list[PortChange] = Field(default_factory=list)
    blockers: list[PortBlocker] = Field(default_factory=list, description="constructs the port could not make run")

    @property
    def gpu_only(self) -> list[PortChange]:
        return [c for c in self.changes if c.kind == "gpu_only_feature"]

    def kinds(self) -> set[str]:
        return {c.kind for c in self.changes}
