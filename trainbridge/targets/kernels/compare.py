"""How close a replacement's outputs must be to the kernel's, per dtype.

An output passes when every element satisfies |got - want| <= atol * max|want| + rtol * |want|.
The relative part is one or two units in the last place of the output dtype (bf16 keeps 8
significant bits, e4m3 4, e5m2 3): a replacement rounds the same float32 value but may sum in a
different order, so it can land one unit away. The absolute part, scaled by the output's
largest value, covers elements that cancel to nearly zero. A factor of 2 too many, a missing
term or a transposed result is off by far more than either, so the check can fail.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel

# dtype name -> (rtol, atol relative to the output's largest magnitude)
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-6, 1e-7),
    "float32": (1e-4, 1e-5),
    "float16": (2e-3, 1e-3),
    "bfloat16": (1.6e-2, 4e-3),
    "float8_e4m3fn": (0.13, 0.01),
    "float8_e5m2": (0.26, 0.01),
}


class OutputComparison(BaseModel):
    case: str
    name: str
    dtype: str
    shape: list[int]
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    passed: bool
    note: str = ""


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def compare(case: str, name: str, got, want) -> OutputComparison:
    """Compare one observed output of the replacement (`got`) with the kernel's (`want`)."""
    if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
        same = got == want
        return OutputComparison(case=case, name=name, dtype=type(want).__name__, shape=[], max_abs=0.0 if same else
                                float("inf"), max_rel=0.0 if same else float("inf"), rtol=0, atol=0, passed=bool(same),
                                note="" if same else f"{got!r} != {want!r}")
    dt = dtype_name(want)
    rtol, atol = TOLERANCES.get(dt, (0.0, 0.0))
    if got.shape != want.shape or got.dtype != want.dtype:
        return OutputComparison(case=case, name=name, dtype=dt, shape=list(want.shape), max_abs=float("inf"),
                                max_rel=float("inf"), rtol=rtol, atol=atol, passed=False,
                                note=f"replacement gave {dtype_name(got)}{list(got.shape)}, kernel "
                                     f"{dt}{list(want.shape)}")
    g = got.detach().to(torch.float64)
    w = want.detach().to(torch.float64)
    nan_g, nan_w = g.isnan(), w.isnan()
    if not torch.equal(nan_g, nan_w):
        return OutputComparison(case=case, name=name, dtype=dt, shape=list(want.shape), max_abs=float("inf"),
                                max_rel=float("inf"), rtol=rtol, atol=atol, passed=False,
                                note=f"NaN at {int((nan_g ^ nan_w).sum())} positions where the other has none")
    g, w = g.masked_fill(nan_g, 0.0), w.masked_fill(nan_w, 0.0)
    diff = (g - w).abs()
    if w.numel() == 0:
        return OutputComparison(case=case, name=name, dtype=dt, shape=list(want.shape), max_abs=0.0, max_rel=0.0,
                                rtol=rtol, atol=atol, passed=True)
    inf_mismatch = (g.isinf() | w.isinf()) & (g != w)
    diff = diff.masked_fill(g.isinf() & w.isinf() & (g == w), 0.0)
    scale = max(float(w.abs().masked_fill(w.isinf(), 0.0).max()), 1e-30)
    bound = atol * scale + rtol * w.abs()
    bad = (diff > bound) | inf_mismatch
    max_abs = float(diff.max())
    note = f"{int(bad.sum())} of {w.numel()} elements outside tolerance" if bool(bad.any()) else ""
    return OutputComparison(case=case, name=name, dtype=dt, shape=list(want.shape), max_abs=max_abs,
                            max_rel=max_abs / scale, rtol=rtol, atol=atol, passed=not bool(bad.any()), note=note)
