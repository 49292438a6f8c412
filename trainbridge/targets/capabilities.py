"""What the target's math units can do fast, where a recipe's choice depends on it.

A GPU program runs bf16 because tensor cores make it faster; a target without bf16 math
units (x86 CPUs without AVX512-BF16 or AMX; Ascend 910A) emulates it, and the same
"precision" becomes a slowdown of 10x or more. The recipes that move precision ask here
instead of assuming.

`TRAINBRIDGE_FAST_BF16=1|0` overrides the detection (tests, or a machine it gets wrong).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

_BF16_CPU_FLAGS = {"avx512_bf16", "amx_bf16"}


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") or line.startswith("Features"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_signature() -> str:
    """The CPU as the figures depend on it: model, family/model numbers, cores, bf16 units.

    "AMD EPYC" names several generations; whether bf16 GEMMs are native (AVX512-BF16/AMX)
    decides which precision recipes apply, so every measured table says which it was.
    """
    from .base import cpu_model

    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    family = f", family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields and "model" in fields else ""
    units = sorted(cpu_flags() & _BF16_CPU_FLAGS)
    bf16 = f"bf16 math units ({', '.join(units)})" if units else "no bf16 math units (bf16 GEMMs emulated)"
    return f"{cpu_model()}{family}, {os.cpu_count()} cores, {bf16}"


def fast_bf16(target: str) -> bool:
    """Whether bf16 GEMMs on `target` are at least as fast as fp32 ones."""
    forced = os.environ.get("TRAINBRIDGE_FAST_BF16")
    if forced in ("0", "1"):
        return forced == "1"
    if target == "cpu":
        flags = cpu_flags()
        # aarch64 CPUs with bf16 dot-product instructions report "bf16"
        return bool(flags & _BF16_CPU_FLAGS) or "bf16" in flags
    return True  # cuda (Ampere on) and Atlas A2 NPUs run bf16 natively
