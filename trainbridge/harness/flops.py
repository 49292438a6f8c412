"""FLOP formulas torch's counter lacks, so a fused rewrite does not look like skipped work.

torch.utils.flop_counter counts the CUDA flash/efficient attention kernels but not the
CPU one (`_scaled_dot_product_flash_attention_for_cpu`, torch 2.13): without these entries
a correct SDPA rewrite would count 0 attention FLOPs and fail work conservation.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

aten = torch.ops.aten


def _cpu_flash_fwd(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_flash_bwd(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


EXTRA_FORMULAS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_fwd,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_bwd,
}


def flop_counter() -> FlopCounterMode:
    return FlopCounterMode(display=False, custom_mapping=EXTRA_FORMULAS)
