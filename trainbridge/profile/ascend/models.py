"""The typed rows of a torch_npu profiler folder and the report built from them.

Rows (`StepTraceRow`, `KernelRow`, `OpStatRow`, `OperatorDetailRow`, `TraceEvent`) mirror one
line of the external files; `AscendProfile` holds one parsed folder; `Finding`,
`StepBreakdown`, `KernelTime` and `AscendProfileReport` are what the analysis returns.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from ..analysis import Verdict

SCHEMA_VERSION = "torch_npu.profiler.ascend_pt/1"

CUBE_TYPE = re.compile(r"matmul|conv|flashattention|gemm|grouped_?matmul", re.IGNORECASE)
COMM_TYPE = re.compile(r"^hcom|hccl|allreduce|allgather|reducescatter|alltoall|broadcast", re.IGNORECASE)


class AscendProfileError(ValueError):
    """The folder cannot be analysed at all (absent, empty, no torch_npu profiler files)."""


class PyTorchTraceOnly(AscendProfileError):
    """The folder holds a plain torch.profiler trace (*.pt.trace.json), not Ascend profiler output."""


# --- parsed rows -------------------------------------------------------------------------------

class StepTraceRow(BaseModel):
    device_id: int | None = None
    step: str | None = None
    computing_us: float
    communication_not_overlapped_us: float
    overlapped_us: float | None = None
    communication_us: float | None = None
    free_us: float
    stage_us: float | None = None
    bubble_us: float | None = None
    preparing_us: float | None = None

    @property
    def step_us(self) -> float:
        """Computing + uncovered communication + free: the advisor's split of one step."""
        return self.computing_us + self.communication_not_overlapped_us + self.free_us


class KernelRow(BaseModel):
    step_id: int | None = None
    device_id: int | None = None
    name: str
    type: str
    accelerator_core: str
    start_us: float
    duration_us: float
    wait_us: float | None = None
    block_dim: int | None = None
    input_shapes: str | None = None
    input_dtypes: str | None = None
    ratios: dict[str, float] = Field(default_factory=dict, description="aic_* / aiv_* *_ratio columns present")

    @property
    def category(self) -> Literal["cube", "vector", "aicpu", "communication"]:
        core = self.accelerator_core.upper()
        if core in ("HCCL", "COMMUNICATION") or COMM_TYPE.search(self.type) or self.name.lower().startswith("hcom"):
            return "communication"
        if core == "AI_CPU":
            return "aicpu"
        if CUBE_TYPE.search(self.type):
            return "cube"
        return "vector"


class OpStatRow(BaseModel):
    op_type: str
    core_type: str
    count: int
    total_us: float
    min_us: float | None = None
    avg_us: float | None = None
    max_us: float | None = None
    ratio_pct: float | None = None


class OperatorDetailRow(BaseModel):
    name: str
    input_shapes: str | None = None
    call_stack: list[str] = Field(default_factory=list, description="frames 'file(line): func', innermost first")
    host_self_us: float | None = None
    device_self_us: float | None = None


class TraceEvent(BaseModel):
    name: str
    ts_us: float
    dur_us: float
    pid: str
    tid: str
    cat: str | None = None
    call_stack: list[str] = Field(default_factory=list)


class AscendProfile(BaseModel):
    """One parsed ASCEND_PROFILER_OUTPUT folder; None for a file that is absent or unusable."""

    path: str
    schema_version: str = SCHEMA_VERSION
    files_present: list[str]
    files_missing: list[str]
    step_trace: list[StepTraceRow] | None = None
    kernels: list[KernelRow] | None = None
    op_stats: list[OpStatRow] | None = None
    operator_details: list[OperatorDetailRow] | None = None
    trace_events: list[TraceEvent] | None = None
    skipped_rows: dict[str, int] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)


# --- report ------------------------------------------------------------------------------------

Severity = Literal["high", "medium", "low", "info"]


class Finding(BaseModel):
    rule: str
    severity: Severity
    message: str
    suggestion: str | None = Field(None, description="a catalog entry name (operator, optimizer or knob)")
    source_lines: list[str] = Field(default_factory=list, description="'file:line' of the user code, when known")
    ops: list[str] = Field(default_factory=list, description="the operators / kernel types concerned")
    count: int | None = None
    value: float | None = Field(None, description="the number the rule fired on (unit in the rule's message)")
    pattern: str | None = Field(None, description="the pattern registry's name for what the suggestion realises "
                                                  "(trainbridge.patterns), so the finding joins the intents and recipes")
    source: str = Field("trainbridge", description="who found it: our analysers, or 'msprof-analyze' (its advisor)")


class StepBreakdown(BaseModel):
    source: Literal["step_trace_time.csv", "kernel_details.csv"]
    steps: int
    step_us: float = Field(..., description="mean step: computing + uncovered communication + free")
    computing_us: float
    communication_us: float = Field(..., description="communication not overlapped by computing")
    free_us: float
    computing_share: float
    communication_share: float
    free_share: float


class KernelTime(BaseModel):
    """Device kernel time by engine, over all kernels of the profile."""

    total_us: float
    cube_us: float
    vector_us: float
    aicpu_us: float
    communication_us: float
    cube_share: float = Field(..., description="of computing kernel time (communication excluded)")
    vector_share: float
    aicpu_share: float
    kernels: int


class AdvisorReport(BaseModel):
    """What the advisor said about one folder, and where its own files are."""

    command: list[str]
    returncode: int | None = Field(None, description="None when it did not finish (timeout)")
    out_dir: str = Field(..., description="the advisor's output folder (its .html page and log/*.xlsx workbook)")
    html: list[str] = Field(default_factory=list)
    xlsx: str | None = None
    findings: list[Finding] = Field(default_factory=list, description="rule `msprof-analyze.<sheet>`, source "
                                                                      "msprof-analyze")
    overall: dict[str, float] = Field(default_factory=dict, description="'Overall Summary': row -> share of E2E time")
    errors: list[str] = Field(default_factory=list, description="the advisor's [ERROR] log lines (unreadable files)")
    note: str = ""


class AscendProfileReport(BaseModel):
    path: str
    schema_version: str
    verdict: Verdict
    evidence: list[str]
    findings: list[Finding]
    breakdown: StepBreakdown | None = None
    kernel_time: KernelTime | None = None
    top_op_types: list[OpStatRow] = Field(default_factory=list)
    files_present: list[str]
    files_missing: list[str]
    skipped_rows: dict[str, int] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    advisor: AdvisorReport | None = Field(None, description="msprof-analyze's advisor on the same folder, where "
                                                            "installed (profile/ascend/advisor.py)")

    def by_rule(self, prefix: str) -> list[Finding]:
        return [f for f in self.findings if f.rule == prefix or f.rule.startswith(prefix + ".")]
