"""The cpu target: measured for real here. Eager PyTorch on a CPU fragments like an NPU port."""

from __future__ import annotations

import resource

import torch

from .base import Target, cpu_model


class CpuTarget(Target):
    name = "cpu"
    device = "cpu"

    def check_available(self) -> None:
        return None

    def synchronize(self) -> None:
        # CPU kernels run on the calling threads: nothing is queued, the boundary is exact.
        torch.cpu.synchronize()

    def reset_peak_memory(self) -> None:
        # ru_maxrss cannot be reset; peak RSS of the whole process is what we report.
        return None

    def peak_memory_mb(self) -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    def device_name(self) -> str:
        return cpu_model()
