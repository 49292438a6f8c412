"""The npu target (Ascend, torch_npu), written against the documented torch_npu API (docs/npu.md).

torch_npu is imported lazily: importing it without the CANN toolkit fails, and once it is
installed `import torch` autoloads it unless TORCH_DEVICE_BACKEND_AUTOLOAD=0. Nothing here
runs on this machine except the availability check, which says clearly what is missing.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from .base import Target, TargetUnavailable

# Knobs the advisor checks (docs/npu.md, "Knobs").
NPU_KNOBS = (
    "TASK_QUEUE_ENABLE", "CPU_AFFINITY_CONF", "PYTORCH_NPU_ALLOC_CONF", "ASCEND_LAUNCH_BLOCKING",
    "ACLNN_CACHE_LIMIT", "HOST_CACHE_CAPACITY", "HCCL_ALGO", "ASCEND_GLOBAL_LOG_LEVEL",
)


def import_torch_npu():
    """Import torch_npu or raise TargetUnavailable saying exactly what is missing."""
    if importlib.util.find_spec("torch_npu") is None:
        raise TargetUnavailable(
            "target npu: torch_npu is not installed. On an Ascend machine install the CANN "
            f"toolkit, then the torch-npu wheel that matches torch {torch.__version__} exactly "
            "(README: 'On an Ascend machine'). Without an NPU use --dry-run."
        )
    try:
        import torch_npu  # noqa: F401
    except Exception as e:  # CANN libraries missing, version mismatch ...
        raise TargetUnavailable(
            f"target npu: torch_npu is installed but failed to import ({type(e).__name__}: {e}). "
            "Usually the CANN toolkit is missing or not sourced (set_env.sh), or torch-npu does "
            "not match this torch version."
        ) from e
    return torch_npu


class NpuTarget(Target):
    name = "npu"
    device = "npu"

    def check_available(self) -> None:
        import_torch_npu()
        if not torch.npu.is_available():  # type: ignore[attr-defined]
            raise TargetUnavailable("target npu: torch_npu imported but no NPU device is visible")

    def synchronize(self) -> None:
        torch.npu.synchronize()  # type: ignore[attr-defined]

    def reset_peak_memory(self) -> None:
        torch.npu.reset_peak_memory_stats()  # type: ignore[attr-defined]

    def peak_memory_mb(self) -> float:
        return torch.npu.max_memory_allocated() / 2**20  # type: ignore[attr-defined]

    def device_name(self) -> str:
        return torch.npu.get_device_name()  # type: ignore[attr-defined]

    def profiler_activities(self) -> list:
        torch_npu = import_torch_npu()
        return [torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU]

    def profiler(self, trace_dir: str | None):
        """torch_npu's own profiler, configured as Ascend's tuning guide shows, so the run keeps
        the `*_ascend_pt/ASCEND_PROFILER_OUTPUT` folder (kernel_details.csv, op_statistic.csv,
        step_trace_time.csv, trace_view.json) that msprof-analyze, MindStudio Insight and
        `trainbridge profile DIR` read. Level 1 with PipeUtilization AI Core metrics: the
        per-kernel aic_*/aiv_* ratios the memory-bound and utilisation verdicts need."""
        P = import_torch_npu().profiler
        config = P._ExperimentalConfig(
            export_type=[P.ExportType.Text], profiler_level=P.ProfilerLevel.Level1,
            aic_metrics=P.AiCMetrics.PipeUtilization, l2_cache=False, op_attr=False, data_simplification=False,
            record_op_args=False)
        return P.profile(activities=self.profiler_activities(),
                         on_trace_ready=P.tensorboard_trace_handler(trace_dir) if trace_dir else None,
                         record_shapes=True, profile_memory=False, with_stack=False, with_modules=False,
                         with_flops=False, experimental_config=config)

    def knobs(self) -> dict[str, str]:
        base = super().knobs()
        base.update({k: os.environ[k] for k in NPU_KNOBS if k in os.environ})
        return base
