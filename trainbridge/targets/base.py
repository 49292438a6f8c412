"""What the harness needs from a device: its name, a clock boundary, memory, a profiler.

A target is used inside the child process that runs the program; everything here is
cheap to construct and imports device libraries (torch_npu) only when asked.
"""

from __future__ import annotations

import os
import platform
from abc import ABC, abstractmethod

import torch


class TargetUnavailable(RuntimeError):
    """The target's device or software is missing on this machine; the message says how to fix it."""


class Target(ABC):
    name: str
    device: str

    @abstractmethod
    def check_available(self) -> None:
        """Raise TargetUnavailable with a clear reason when this target cannot run here."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block until queued device work is done: every step boundary calls this."""

    @abstractmethod
    def reset_peak_memory(self) -> None: ...

    @abstractmethod
    def peak_memory_mb(self) -> float: ...

    @abstractmethod
    def device_name(self) -> str: ...

    def profiler_activities(self) -> list:
        return [torch.profiler.ProfilerActivity.CPU]

    def profiler(self, trace_dir: str | None):
        """The profiler the harness starts over the profile steps. torch.profiler, its trace
        written by tensorboard_trace_handler (`<worker>.<time>.pt.trace.json`), where
        TensorBoard and Holistic Trace Analysis look for it."""
        handler = torch.profiler.tensorboard_trace_handler(trace_dir) if trace_dir else None
        return torch.profiler.profile(activities=self.profiler_activities(), on_trace_ready=handler)

    def knobs(self) -> dict[str, str]:
        """Environment knobs that matter on this target, as currently set (recorded in results)."""
        names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "KMP_AFFINITY", "LD_PRELOAD")
        return {k: os.environ[k] for k in names if k in os.environ}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
