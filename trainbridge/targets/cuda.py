"""The cuda target: the GPU programs' home; same code path as the others."""

from __future__ import annotations

import torch

from .base import Target, TargetUnavailable


class CudaTarget(Target):
    name = "cuda"
    device = "cuda"

    def check_available(self) -> None:
        if not torch.cuda.is_available():
            raise TargetUnavailable(
                f"target cuda: torch {torch.__version__} sees no CUDA device "
                f"(torch.version.cuda={torch.version.cuda}). Install a CUDA build of torch "
                "(see README: 'On a GPU machine') on a machine with an NVIDIA GPU."
            )

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def reset_peak_memory(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def peak_memory_mb(self) -> float:
        return torch.cuda.max_memory_allocated() / 2**20

    def device_name(self) -> str:
        return torch.cuda.get_device_name()

    def profiler_activities(self) -> list:
        return [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]

    def knobs(self) -> dict[str, str]:
        import os

        base = super().knobs()
        for k in ("CUDA_LAUNCH_BLOCKING", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES"):
            if k in os.environ:
                base[k] = os.environ[k]
        return base
