"""Does the candidate compute the same thing? Two levels, as measurement_integrity.md asks.

1. Whole program: the loss trajectory over K steps from the same seed, within a
   dtype-aware tolerance; zero, constant or non-finite losses fail outright (a candidate
   that returns a cached or zero loss must not pass an absolute tolerance).
2. Region ("lab") check: the replaced function against the original on fresh random
   inputs per trial, forward error within the dtype's precision and gradient cosine.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from pydantic import BaseModel

# forward tolerances per dtype (atol, rtol): fp32 tight, bf16 2^-7, fp16 2^-10 (Ascend verifier)
LAB_TOLERANCE = {
    torch.float32: (1e-5, 1.3e-4),
    torch.bfloat16: (1e-2, 2**-7),
    torch.float16: (1e-3, 2**-10),
}
GRAD_COSINE_MIN = 0.9999


class LossVerdict(BaseModel):
    passed: bool
    reason: str
    worst_step: int | None = None
    worst_rel_diff: float | None = None
    tolerance: float | None = None


def compare_losses(baseline: list[float | None], candidate: list[float | None], *, rtol_fp32: float,
                   rtol_low_precision: float, low_precision: bool, steps: int) -> LossVerdict:
    if len(candidate) < steps or len(baseline) < steps:
        return LossVerdict(passed=False, reason=f"only {min(len(candidate), len(baseline))} of {steps} steps have losses")
    b, c = baseline[:steps], candidate[:steps]
    for i, (x, y) in enumerate(zip(b, c), start=1):
        if x is None or y is None:
            return LossVerdict(passed=False, reason=f"step {i}: loss missing")
        if not math.isfinite(y):
            return LossVerdict(passed=False, reason=f"step {i}: candidate loss is {y}")
    if all(y == 0.0 for y in c):
        return LossVerdict(passed=False, reason="candidate losses are all exactly zero")
    if len(set(c)) == 1 and len(set(b)) > 1:
        return LossVerdict(passed=False, reason=f"candidate loss is constant ({c[0]}) while the baseline's moves")
    tol = rtol_low_precision if low_precision else rtol_fp32
    worst, worst_i, worst_tol = 0.0, 0, tol
    for i, (x, y) in enumerate(zip(b, c), start=1):
        # low precision drifts a little more with every step it compounds
        t = tol * (1 + i / steps) if low_precision else tol
        rel = abs(y - x) / max(abs(x), 1e-12)
        if rel / t > worst / worst_tol:
            worst, worst_i, worst_tol = rel, i, t
    if worst > worst_tol:
        return LossVerdict(passed=False, worst_step=worst_i, worst_rel_diff=worst, tolerance=worst_tol,
                           reason=(f"loss leaves tolerance at step {worst_i}: baseline {b[worst_i - 1]:.5f}, "
                                   f"candidate {c[worst_i - 1]:.5f} (rel {worst:.2e} > {worst_tol:.1e})"))
    tail = max(1, steps // 4)
    mb, mc = sum(b[-tail:]) / tail, sum(c[-tail:]) / tail
    if abs(mc - mb) / max(abs(mb), 1e-12) > tol:
        return LossVerdict(passed=False, reason=f"mean of the last {tail} losses {mc:.5f} vs baseline {mb:.5f}")
    return LossVerdict(passed=True, worst_step=worst_i, worst_rel_diff=worst, tolerance=worst_tol,
                       reason=f"{steps} steps within tolerance (worst rel {worst:.2e} at step {worst_i}, tol {worst_tol:.1e})")


class LabVerdict(BaseModel):
    passed: bool
    reason: str
    max_abs_err: float
    max_rel_err: float
    min_grad_cosine: float | None


def lab_check(reference_fn: Callable, candidate_fn: Callable, make_inputs: Callable[[torch.Generator], tuple], *,
              dtype: torch.dtype = torch.float32, trials: int = 3, seed: int = 0) -> LabVerdict:
    """Region check on fresh random inputs each trial; `make_inputs(gen)` returns a tuple."""
    atol, rtol = LAB_TOLERANCE[dtype]
    worst_abs = worst_rel = 0.0
    min_cos: float | None = None
    for t in range(trials):
        gen = torch.Generator().manual_seed(seed + 1000 * t)
        base = make_inputs(gen)
        ins_r = [x.detach().clone().requires_grad_(x.requires_grad) if torch.is_tensor(x) else x for x in base]
        ins_c = [x.detach().clone().requires_grad_(x.requires_grad) if torch.is_tensor(x) else x for x in base]
        out_r, out_c = reference_fn(*ins_r), candidate_fn(*ins_c)
        if out_c.shape != out_r.shape:
            return LabVerdict(passed=False, reason=f"shape {tuple(out_c.shape)} != {tuple(out_r.shape)}",
                              max_abs_err=math.inf, max_rel_err=math.inf, min_grad_cosine=None)
        diff = (out_c.float() - out_r.float()).abs()
        worst_abs = max(worst_abs, float(diff.max()))
        worst_rel = max(worst_rel, float((diff / (out_r.float().abs() + atol)).max()))
        if not torch.allclose(out_c.float(), out_r.float(), atol=atol, rtol=rtol):
            return LabVerdict(passed=False, reason=f"trial {t}: forward error {float(diff.max()):.3e} beyond "
                              f"atol {atol:g} / rtol {rtol:g} for {dtype}", max_abs_err=worst_abs,
                              max_rel_err=worst_rel, min_grad_cosine=min_cos)
        if out_r.requires_grad:
            g = torch.randn(out_r.shape, generator=gen, dtype=out_r.dtype)
            out_r.backward(g)
            out_c.backward(g)
            for xr, xc in zip(ins_r, ins_c):
                if torch.is_tensor(xr) and xr.requires_grad:
                    if xc.grad is None:
                        return LabVerdict(passed=False, reason="candidate gives no gradient for an input",
                                          max_abs_err=worst_abs, max_rel_err=worst_rel, min_grad_cosine=0.0)
                    cos = float(torch.nn.functional.cosine_similarity(
                        xr.grad.flatten().double(), xc.grad.flatten().double(), dim=0))
                    min_cos = cos if min_cos is None else min(min_cos, cos)
                    if cos < GRAD_COSINE_MIN:
                        return LabVerdict(passed=False, reason=f"gradient cosine {cos:.6f} < {GRAD_COSINE_MIN}",
                                          max_abs_err=worst_abs, max_rel_err=worst_rel, min_grad_cosine=min_cos)
    return LabVerdict(passed=True, reason=f"{trials} trials within tolerance", max_abs_err=worst_abs,
                      max_rel_err=worst_rel, min_grad_cosine=min_cos)
