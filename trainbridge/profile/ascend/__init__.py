"""Offline analysis of a torch_npu.profiler output folder, the Ascend side of `ProfileReport`.

Why offline and stateless: profiling must not slow or crash training, and the same folder
must always give the same report. `load_ascend_profile(path)` parses
`*_ascend_pt/ASCEND_PROFILER_OUTPUT/` (step_trace_time.csv, kernel_details.csv,
op_statistic.csv, operator_details.csv, trace_view.json) into typed rows against a
versioned schema (`SCHEMA`); missing optional files are listed, malformed rows are skipped
and counted. The analyzers (`step_breakdown`, `kernel_time`, `aicpu_ops`, `bound_ops`,
`matmul_alignment`, `affinity_matches`, `schedule_check`, `check_environment`) are pure
functions of those rows; `analyse_ascend` joins them into an `AscendProfileReport` whose
verdict uses the msprof-analyze advisor's thresholds (docs/npu.md) and
whose suggestions name entries of trainbridge/targets/npu_catalog.json.

Modules, one job each: `models` (rows and report), `load` (finding and reading the folder),
`breakdown` (step and kernel time), `findings` (AI CPU, bound ops, alignment, schedule,
environment), `affinity` (the fused-API pattern table and its matcher), `analyse` (verdict
and front door), `render` (the rich report the `trainbridge profile DIR` command prints).
"""

from .affinity import (
    AFFINITY,
    FUSED_OPTIMIZER,
    OPTIMIZER_STEP,
    affinity_matches,
    top_level_aten,
)
from .analyse import (
    COMM_BOUND_SHARE,
    HOST_BOUND_FREE_SHARE,
    SHARE_THRESHOLD,
    analyse_ascend,
    analyse_ranks,
)
from .breakdown import kernel_breakdown, kernel_time, step_breakdown
from .findings import (
    ACLNN_CACHE_MIN,
    ACLOP_COMPILE_CALLS,
    AICPU_US,
    BOUND_RATIO,
    MATMUL_ALIGN,
    aicpu_ops,
    bound_ops,
    check_environment,
    matmul_alignment,
    matmul_inner_axis,
    schedule_check,
)
from .load import (
    ALIASES,
    FILES,
    OUTPUT_DIR,
    SCHEMA,
    find_output_dir,
    find_output_dirs,
    load_ascend_profile,
)
from .models import (
    COMM_TYPE,
    CUBE_TYPE,
    SCHEMA_VERSION,
    AscendProfile,
    AscendProfileError,
    AscendProfileReport,
    Finding,
    KernelRow,
    KernelTime,
    OperatorDetailRow,
    OpStatRow,
    PyTorchTraceOnly,
    Severity,
    StepBreakdown,
    StepTraceRow,
    TraceEvent,
)

__all__ = [
    "ACLNN_CACHE_MIN", "ACLOP_COMPILE_CALLS", "AFFINITY", "AICPU_US", "ALIASES", "BOUND_RATIO", "COMM_BOUND_SHARE",
    "COMM_TYPE", "CUBE_TYPE", "FILES", "FUSED_OPTIMIZER", "HOST_BOUND_FREE_SHARE", "MATMUL_ALIGN", "OPTIMIZER_STEP",
    "OUTPUT_DIR", "SCHEMA", "SCHEMA_VERSION", "SHARE_THRESHOLD", "AscendProfile", "AscendProfileError",
    "AscendProfileReport", "Finding", "KernelRow", "KernelTime", "OpStatRow", "OperatorDetailRow",
    "PyTorchTraceOnly", "Severity", "StepBreakdown", "StepTraceRow", "TraceEvent", "affinity_matches", "aicpu_ops",
    "analyse_ascend", "analyse_ranks", "bound_ops", "check_environment", "find_output_dir", "find_output_dirs",
    "kernel_breakdown", "kernel_time", "load_ascend_profile", "matmul_alignment", "matmul_inner_axis",
    "schedule_check", "step_breakdown", "top_level_aten",
]
