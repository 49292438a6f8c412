"""Bit shifts on unsigned tensors, for targets whose eager kernels lack them.

Programs that keep a bf16 parameter's lost mantissa bits beside it (the records from
2026-01 on) rebuild the fp32 value as `(p.to(torch.uint32) << 16) | mantissa` and split it
again with `>> 16`. PyTorch's CPU kernels have no left or right shift for uint16, uint32 or
uint64 ("lshift_cpu" not implemented for 'UInt32'). The same bits come out of a shift in a
signed type wide enough to hold them: uint16 and uint32 widen to int64 (the result masked
back to the width, so a right shift is logical), uint64 is reinterpreted as int64 (a left
shift is the same bits; a right shift is masked to be logical). Anything else, a Python int
included, takes the plain operator.
"""

from __future__ import annotations

import torch

_WIDTH_BITS = {torch.uint16: 16, torch.uint32: 32, torch.uint64: 64}


def _plain(k):
    return k.to(torch.int64) if isinstance(k, torch.Tensor) and k.dtype in _WIDTH_BITS else k


def lshift(a, k):
    if not isinstance(a, torch.Tensor) or a.dtype not in _WIDTH_BITS:
        return a << k
    bits = _WIDTH_BITS[a.dtype]
    if bits == 64:
        return (a.view(torch.int64) << _plain(k)).view(torch.uint64)
    return ((a.to(torch.int64) << _plain(k)) & ((1 << bits) - 1)).to(a.dtype)


def rshift(a, k):
    if not isinstance(a, torch.Tensor) or a.dtype not in _WIDTH_BITS:
        return a >> k
    bits = _WIDTH_BITS[a.dtype]
    if bits == 64:
        k = _plain(k)
        keep = (torch.ones_like(a.view(torch.int64)) << (64 - k)) - 1  # the low 64-k bits
        shifted = (a.view(torch.int64) >> k) & keep
        return torch.where(torch.as_tensor(k) == 0, a.view(torch.int64), shifted).view(torch.uint64)
    return (a.to(torch.int64) >> _plain(k)).to(a.dtype)
