"""Target backends: cpu (measured here), cuda and npu (same code path, measured on their machines)."""

from __future__ import annotations

from .base import Target, TargetUnavailable

TARGET_NAMES = ("cpu", "cuda", "npu")


def get_target(name: str) -> Target:
    if name == "cpu":
        from .cpu import CpuTarget

        return CpuTarget()
    if name == "cuda":
        from .cuda import CudaTarget

        return CudaTarget()
    if name == "npu":
        from .npu import NpuTarget

        return NpuTarget()
    raise ValueError(f"unknown target {name!r}: choose one of {', '.join(TARGET_NAMES)}")


__all__ = ["Target", "TargetUnavailable", "get_target", "TARGET_NAMES"]
