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
        # the high-water mark cannot be reset; peak RSS of the whole process is what we report.
        return None

    def peak_memory_mb(self) -> float:
        return peak_rss_mb()

    def device_name(self) -> str:
        return cpu_model()


def peak_rss_mb() -> float:
    """This program's peak resident memory: VmHWM of its own address space.

    Not `ru_maxrss`: Linux carries that across fork and exec, so a child started by a parent
    holding 4 GB reports 4 GB whatever it used itself."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # no /proc (macOS: bytes there)
