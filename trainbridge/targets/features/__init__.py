"""GPU-only features of a program, each ported to the target by its own module.

The naive port (`targets/port_source.py`) handles what every GPU program has: device strings,
`torch.cuda.*`, NCCL, `torch.compile`. The features here are what modern GPU training
programs add on top, each needing a replacement the target can run:

| module | feature | replacement |
| --- | --- | --- |
| distributed | torchrun env, `init_process_group(device_id=...)`, world-size asserts, collectives gloo lacks | the harness plays torchrun (one rank); the shim completes what gloo cannot |
| flex_attention | FlexAttention (`flex_attention`, `create_block_mask`, `BlockMask`) | SDPA with the block mask's token mask |
| flash_attention | FlashAttention-3 (`flash_attn_interface`, `kernels.get_kernel(...)`) | per-document SDPA / `npu_fusion_attention` TND |
| triton_kernels | `@triton.jit` kernels and their launchers, the NVRTC kernel | PyTorch functions from a catalog, checked against the kernel |
| fp8 | `torch._scaled_mm`, float8 custom ops | the target's fast 16-bit matmul (a semantic change) |
| unsigned_shifts | `<<` / `>>` on uint16/32/64 tensors (eager CPU has none) | the same bits via int64 |

Each module has `port(files, target) -> FeatureResult`: the program's files after its rewrite
(a module may add a shim file, `_tb_<name>.py`, copied from `targets/shims/`), one
`PortChange` per edit, and a `PortBlocker` for every construct it found and could not port,
naming it, so a record that cannot run says precisely why instead of crashing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["FeatureName", "FeaturePort", "FeatureResult", "PortBlocker", "PortChange"]

from ..port_models import PortBlocker, PortChange, PortTarget


class FeatureResult(BaseModel):
    files: dict[str, str]
    changes: list[PortChange] = Field(default_factory=list)
    blockers: list[PortBlocker] = Field(default_factory=list)


FeaturePort = Callable[[dict[str, str], PortTarget], FeatureResult]
FeatureName = Literal["distributed", "flex_attention", "flash_attention", "triton_kernels", "fp8", "unsigned_shifts"]
