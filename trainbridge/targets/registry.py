"""The target registry: one `TargetSpec` per device the tool ports to, measures on and rewrites for.

Every stage that needs a fact about a target (its torch device string, the import that
registers it, its collective backend, the command that lists its devices, whether the GPU
programs were written for it) reads it here instead of testing `target == "npu"`. Adding a
target means adding a row here and the pieces listed in targets/README.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TargetName = Literal["cpu", "cuda", "npu"]


class TargetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: TargetName
    summary: str
    device_type: str = Field(..., description="torch's device type: `.to(...)`, `torch.autocast(device_type=...)`")
    runtime_imports: tuple[str, ...] = Field(
        (), description="import lines a program needs before it can use the device (registering the backend)")
    indexed_devices: bool = Field(True, description="devices are numbered (`npu:1`); a CPU is one device")
    dist_backend: str = Field(..., description="the torch.distributed backend its collectives use")
    device_list_command: str = Field(..., description="what replaces a program's `nvidia-smi` call")
    source_device: bool = Field(
        False, description="the training programs are written for this device: porting leaves them as they are")
    measured_here: bool = Field(
        False, description="the development and CI machines can run and time it (figures name the CPU)")
    target_class: str = Field(..., description="module:class of its `Target`, imported only when asked")


TARGETS: dict[str, TargetSpec] = {s.name: s for s in (
    TargetSpec(name="cpu", summary="measured here: eager PyTorch on a CPU is fragmented too",
               device_type="cpu", indexed_devices=False, dist_backend="gloo", device_list_command="lscpu", measured_here=True,
               target_class="trainbridge.targets.cpu:CpuTarget"),
    TargetSpec(name="cuda", summary="NVIDIA GPUs, the device the programs were written for",
               device_type="cuda", dist_backend="nccl", device_list_command="nvidia-smi", source_device=True,
               target_class="trainbridge.targets.cuda:CudaTarget"),
    TargetSpec(name="npu", summary="Huawei Ascend NPUs through torch_npu (measured on an Ascend machine)",
               device_type="npu", runtime_imports=("import torch_npu",), dist_backend="hccl",
               device_list_command="npu-smi info", target_class="trainbridge.targets.npu:NpuTarget"),
)}
"""Target name -> its row."""

TARGET_NAMES: tuple[str, ...] = tuple(TARGETS)


def target_spec(name: str) -> TargetSpec:
    """The row for `name`; a clear error naming the known targets otherwise."""
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}: choose one of {', '.join(TARGET_NAMES)}") from None
