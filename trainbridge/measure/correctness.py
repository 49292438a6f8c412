"""Does the candidate compute the same thing? Two levels, as docs/measurement_integrity.md says.

1. Whole program (`compare_losses`): the loss trajectory over K steps from the same seed,
   within a dtype-aware tolerance. Missing, non-finite, exactly-zero or constant losses fail
   outright: a candidate returning a cached or zero loss must not pass a tolerance.
2. Region (`lab_check`): the replaced function against the original on fresh random inputs
   per trial (so a cached output cannot pass), forward error within the dtype's precision,
   and for every input that requires grad a gradient with cosine > 0.9999 and the same norm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from pydantic import BaseModel, Field

# ----------------------------------------------------------- loss trajectory ----
LAST_K = 3  # losses averaged at the end of a low-precision trajectory


class LossVerdict(BaseModel):
    """Loss trajectory of a candidate against the baseline's, from the same seed."""

    passed: bool
    reason: str
    steps_compared: int = 0
    precision: Literal["fp32", "low_precision"] = "fp32"
    rtol: float = Field(0.0, description="base relative tolerance of the precision class")
    worst_step: int | None = Field(None, description="1-based step with the largest diff relative to its tolerance")
    worst_baseline_loss: float | None = None
    worst_candidate_loss: float | None = None
    worst_rel_diff: float | None = None
    tolerance: float | None = Field(None, description="tolerance that applied at worst_step")
    last_k: int | None = None
    last_k_rel_diff: float | None = Field(None, description="relative diff of the mean of the last k losses")


def step_tolerance(rtol: float, step: int, steps: int, low_precision: bool) -> float:
    """Tolerance at 1-based `step`: fp32 flat; low precision rtol * (1 + step/steps).

    Rounding error compounds through the optimizer, so a bf16/fp16 trajectory may wander a
    little more each step: up to twice the base tolerance at the last compared step. The
    mean of the last few losses is still held to the base tolerance, so a systematic drift
    cannot hide in the widening band.
    """
    return rtol * (1.0 + step / steps) if low_precision else rtol


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compare_losses(
    baseline: Sequence[float | None],
    candidate: Sequence[float | None],
    *,
    rtol_fp32: float,
    rtol_low_precision: float,
    low_precision: bool,
    steps: int,
) -> LossVerdict:
    """Compare the first `steps` losses; every failure names the step and both values."""
    if steps < 1:
        raise ValueError("steps must be >= 1")
    precision = "low_precision" if low_precision else "fp32"
    rtol = rtol_low_precision if low_precision else rtol_fp32
    base = {"precision": precision, "rtol": rtol}

    def fail(reason: str, **kw) -> LossVerdict:
        return LossVerdict(passed=False, reason=reason, **base, **kw)

    if len(baseline) < steps:
        return fail(f"baseline recorded {len(baseline)} losses, {steps} needed")
    if len(candidate) < steps:
        return fail(f"candidate recorded {len(candidate)} of {steps} steps' losses (stopped early?)")
    b, c = list(baseline[:steps]), list(candidate[:steps])
    for i, (x, y) in enumerate(zip(b, c), start=1):
        if x is None or not math.isfinite(x):
            return fail(f"step {i}: baseline loss is {x}: no reference to compare against")
        if y is None:
            return fail(f"step {i}: candidate loss missing (backward() on no tensor?)", worst_step=i)
        if not math.isfinite(y):
            return fail(f"step {i}: candidate loss is {y}", worst_step=i, worst_candidate_loss=None)
        if y == 0.0 and x != 0.0:
            return fail(f"step {i}: candidate loss is exactly 0 (baseline {x:.6g}): a zeroed loss",
                        worst_step=i, worst_baseline_loss=x, worst_candidate_loss=y)
    if steps > 1 and len(set(c)) == 1 and len(set(b)) > 1:
        return fail(f"candidate loss is constant ({c[0]:.6g}) over {steps} steps while the baseline's moves "
                    f"({min(b):.6g}..{max(b):.6g}): a cached or detached loss")

    worst_i, worst_ratio = 1, -1.0
    for i, (x, y) in enumerate(zip(b, c), start=1):
        ratio = _rel(y, x) / step_tolerance(rtol, i, steps, low_precision)
        if ratio > worst_ratio:
            worst_i, worst_ratio = i, ratio
    wx, wy = b[worst_i - 1], c[worst_i - 1]
    wtol = step_tolerance(rtol, worst_i, steps, low_precision)
    worst = {"worst_step": worst_i, "worst_baseline_loss": wx, "worst_candidate_loss": wy,
             "worst_rel_diff": _rel(wy, wx), "tolerance": wtol, "steps_compared": steps}
    if worst_ratio > 1.0:
        return fail(f"step {worst_i}: candidate loss {wy:.6g} vs baseline {wx:.6g}: rel diff "
                    f"{_rel(wy, wx):.2e} > {precision} tolerance {wtol:.2e}", **worst)

    k = min(LAST_K, steps)
    mb, mc = sum(b[-k:]) / k, sum(c[-k:]) / k
    tail = {"last_k": k, "last_k_rel_diff": _rel(mc, mb)}
    if _rel(mc, mb) > rtol:
        return fail(f"mean of the last {k} losses {mc:.6g} vs baseline {mb:.6g}: rel diff {_rel(mc, mb):.2e} "
                    f"> {rtol:.2e} (a drift inside the per-step band)", **worst, **tail)
    return LossVerdict(passed=True, **base, **worst, **tail,
                       reason=(f"{steps} steps within {precision} tolerance: worst rel diff "
                               f"{_rel(wy, wx):.2e} at step {worst_i} (tol {wtol:.2e})"))


# --------------------------------------------------------------- lab check ----
# (atol, rtol) of the forward output per dtype: allclose semantics |c - r| <= atol + rtol*|r|.
# fp32 ~1e-5 with an atol; bf16 2^-7 and fp16 2^-10 (the Ascend triton-op verifier's table).
LAB_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1e-2, 2**-7),
    torch.float16: (1e-3, 2**-10),
}
GRAD_COSINE_MIN = 0.9999
# |‖g_cand‖ / ‖g_ref‖ - 1| allowed: cosine alone cannot see a gradient scaled by 2.
GRAD_NORM_RTOL: dict[torch.dtype, float] = {torch.float32: 1e-4, torch.bfloat16: 2**-5, torch.float16: 2**-8}


class LabTrial(BaseModel):
    trial: int
    passed: bool
    reason: str
    max_abs_err: float | None = None
    max_rel_err: float | None = Field(None, description="over elements with |reference| > atol")
    grad_cosines: list[float] = Field(default_factory=list, description="per input that requires grad")
    grad_norm_ratios: list[float] = Field(default_factory=list)


class LabVerdict(BaseModel):
    """A replaced region against the original on fresh random inputs."""

    passed: bool
    reason: str
    dtype: str
    trials: int
    atol: float
    rtol: float
    grad_cosine_min: float
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    min_grad_cosine: float | None = None
    trial_results: list[LabTrial] = Field(default_factory=list)


def _flat(out) -> list:
    """Tensors of an output in a fixed order (tensor, tuple/list, dict by key)."""
    if torch.is_tensor(out):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in _flat(out[k])]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat(o)]
    return [out]


def _fresh_copy(inputs: list) -> list:
    return [x.detach().clone().requires_grad_(x.requires_grad) if torch.is_tensor(x) else x for x in inputs]


def _forward_errors(c: torch.Tensor, r: torch.Tensor, atol: float, rtol: float) -> tuple[float, float, bool]:
    cd, rd = c.detach().double(), r.detach().double()
    diff = (cd - rd).abs()
    ok = bool(torch.all(diff <= atol + rtol * rd.abs()))
    big = rd.abs() > atol
    max_rel = float((diff[big] / rd.abs()[big]).max()) if bool(big.any()) else 0.0
    return (float(diff.max()) if diff.numel() else 0.0), max_rel, ok


def _same_inputs(a: list, b: list) -> bool:
    ta, tb = [x for x in a if torch.is_tensor(x)], [x for x in b if torch.is_tensor(x)]
    return bool(ta) and len(ta) == len(tb) and all(
        x.shape == y.shape and torch.equal(x.detach(), y.detach()) for x, y in zip(ta, tb))


def _trial(reference_fn, candidate_fn, inputs: list, gen: torch.Generator, t: int, atol: float, rtol: float,
           cos_min: float, norm_rtol: float, table: dict[torch.dtype, tuple[float, float]]) -> LabTrial:
    ins_c, ins_r = _fresh_copy(inputs), _fresh_copy(inputs)
    # Candidate first: nothing of the reference's exists yet for a torch.empty to pick up.
    try:
        out_c = _flat(candidate_fn(*ins_c))
    except Exception as e:  # a failing candidate is a verdict, not a crash of the checker
        return LabTrial(trial=t, passed=False, reason=f"candidate raised {type(e).__name__}: {e}")
    out_r = _flat(reference_fn(*ins_r))
    if len(out_c) != len(out_r):
        return LabTrial(trial=t, passed=False, reason=f"candidate returned {len(out_c)} outputs, reference {len(out_r)}")
    worst_abs = worst_rel = 0.0
    for j, (c, r) in enumerate(zip(out_c, out_r)):
        if not torch.is_tensor(c) or not torch.is_tensor(r):
            if c != r:
                return LabTrial(trial=t, passed=False, reason=f"output {j}: {c!r} != reference {r!r}")
            continue
        if c.shape != r.shape or c.dtype != r.dtype:
            return LabTrial(trial=t, passed=False, reason=(
                f"output {j}: {tuple(c.shape)} {c.dtype} vs reference {tuple(r.shape)} {r.dtype}"))
        if not bool(torch.isfinite(c).all()) and bool(torch.isfinite(r).all()):
            return LabTrial(trial=t, passed=False, reason=f"output {j}: candidate has non-finite values")
        if c.numel() and not bool(c.any()) and bool(r.any()):
            return LabTrial(trial=t, passed=False, reason=f"output {j}: candidate output is all zeros")
        # An output computed in a coarser dtype than the inputs (a bf16 iteration on fp32 arguments)
        # is held to its own dtype's precision, never to a finer one it cannot carry.
        atol_j, rtol_j = max(atol, table.get(r.dtype, (0.0, 0.0))[0]), max(rtol, table.get(r.dtype, (0.0, 0.0))[1])
        a, rel, ok = _forward_errors(c, r, atol_j, rtol_j)
        worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, rel)
        if not ok:
            return LabTrial(trial=t, passed=False, max_abs_err=worst_abs, max_rel_err=worst_rel, reason=(
                f"output {j}: forward error max abs {a:.3e}, max rel {rel:.3e} beyond atol {atol_j:g} + rtol {rtol_j:g}"))

    pairs = [(c, r) for c, r in zip(out_c, out_r) if torch.is_tensor(r) and r.requires_grad]
    norm_rtol = max([norm_rtol, *(GRAD_NORM_RTOL.get(r.dtype, 0.0) for _, r in pairs)])
    wants = [i for i, x in enumerate(ins_r) if torch.is_tensor(x) and x.requires_grad]
    cosines: list[float] = []
    ratios: list[float] = []
    if pairs and wants:
        if any(not c.requires_grad for c, _ in pairs):
            return LabTrial(trial=t, passed=False, max_abs_err=worst_abs, max_rel_err=worst_rel,
                            reason="candidate output is detached from the inputs (no autograd graph)")
        # A random cotangent, not out.sum(): the gradient of sum() is blind to some errors
        # (softmax's is exactly zero).
        cot = [torch.randn(r.shape, generator=gen, dtype=torch.float32).to(device=r.device, dtype=r.dtype)
               for _, r in pairs]
        g_r = torch.autograd.grad([r for _, r in pairs], [ins_r[i] for i in wants], cot, allow_unused=True)
        try:
            g_c = torch.autograd.grad([c for c, _ in pairs], [ins_c[i] for i in wants], cot, allow_unused=True)
        except Exception as e:
            return LabTrial(trial=t, passed=False, reason=f"candidate backward raised {type(e).__name__}: {e}")
        for i, gr, gc in zip(wants, g_r, g_c):
            if gr is None:
                continue
            if gc is None:
                return LabTrial(trial=t, passed=False, max_abs_err=worst_abs, max_rel_err=worst_rel,
                                grad_cosines=cosines, reason=f"input {i}: candidate gives no gradient")
            vr, vc = gr.detach().double().flatten(), gc.detach().double().flatten()
            nr, nc = float(vr.norm()), float(vc.norm())
            if nr == 0.0 and nc == 0.0:
                cos, ratio = 1.0, 1.0
            elif nr == 0.0 or nc == 0.0:
                cos, ratio = 0.0, (math.inf if nr == 0.0 else 0.0)
            else:
                cos, ratio = float(vr @ vc) / (nr * nc), nc / nr
            cosines.append(cos)
            ratios.append(ratio)
            if not cos > cos_min:
                return LabTrial(trial=t, passed=False, max_abs_err=worst_abs, max_rel_err=worst_rel,
                                grad_cosines=cosines, grad_norm_ratios=ratios,
                                reason=f"input {i}: gradient cosine {cos:.6f} <= {cos_min}")
            if abs(ratio - 1.0) > norm_rtol:
                return LabTrial(trial=t, passed=False, max_abs_err=worst_abs, max_rel_err=worst_rel,
                                grad_cosines=cosines, grad_norm_ratios=ratios,
                                reason=f"input {i}: gradient norm ratio {ratio:.6f} (allowed 1 +/- {norm_rtol:g})")
    return LabTrial(trial=t, passed=True, reason="within tolerance", max_abs_err=worst_abs, max_rel_err=worst_rel,
                    grad_cosines=cosines, grad_norm_ratios=ratios)


def lab_check(
    reference_fn: Callable,
    candidate_fn: Callable,
    make_inputs: Callable[[torch.Generator], Sequence | torch.Tensor],
    *,
    dtype: torch.dtype = torch.float32,
    trials: int = 3,
    seed: int = 0,
    tolerances: dict[torch.dtype, tuple[float, float]] | None = None,
    grad_cosine_min: float = GRAD_COSINE_MIN,
) -> LabVerdict:
    """Region check: `make_inputs(generator)` gives the positional inputs of one call.

    Parameters of the region (weights) must be inputs too, so their gradients are checked.
    Each trial seeds a new generator (and the global RNG), so the inputs differ per trial;
    inputs that do not differ fail, since they could not catch a cached output.
    """
    if trials < 1:
        raise ValueError("trials must be >= 1")
    table = {**LAB_TOLERANCE, **(tolerances or {})}
    if dtype not in table:
        raise ValueError(f"no lab tolerance for {dtype}; pass tolerances={{dtype: (atol, rtol)}}")
    atol, rtol = table[dtype]
    norm_rtol = GRAD_NORM_RTOL.get(dtype, max(10 * rtol, 1e-4))
    results: list[LabTrial] = []
    previous: list | None = None
    for t in range(trials):
        trial_seed = seed + 1000 * t + 1
        gen = torch.Generator().manual_seed(trial_seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(trial_seed)
            raw = make_inputs(gen)
            inputs = [raw] if torch.is_tensor(raw) else list(raw)
            if previous is not None and _same_inputs(previous, inputs):
                results.append(LabTrial(trial=t, passed=False,
                                        reason="make_inputs returned the same inputs as the previous trial"))
                break
            previous = [x.detach().clone() if torch.is_tensor(x) else x for x in inputs]
            results.append(_trial(reference_fn, candidate_fn, inputs, gen, t, atol, rtol, grad_cosine_min, norm_rtol,
                                  table))
        if not results[-1].passed:
            break
    abs_errs = [r.max_abs_err for r in results if r.max_abs_err is not None]
    rel_errs = [r.max_rel_err for r in results if r.max_rel_err is not None]
    cosines = [c for r in results for c in r.grad_cosines]
    failed = next((r for r in results if not r.passed), None)
    reason = (f"trial {failed.trial}: {failed.reason}" if failed else
              f"{trials} trials on fresh inputs within {str(dtype).removeprefix('torch.')} tolerance "
              f"(atol {atol:g}, rtol {rtol:g})" + (f", min grad cosine {min(cosines):.6f}" if cosines else ""))
    return LabVerdict(
        passed=failed is None, reason=reason, dtype=str(dtype).removeprefix("torch."), trials=trials, atol=atol,
        rtol=rtol, grad_cosine_min=grad_cosine_min, max_abs_err=max(abs_errs) if abs_errs else None,
        max_rel_err=max(rel_errs) if rel_errs else None, min_grad_cosine=min(cosines) if cosines else None,
        trial_results=results,
    )


def compare_loss_windows(baseline: Sequence[float | None], candidate: Sequence[float | None], *, window: int,
                         rtol: float) -> LossVerdict:
    """A low-precision candidate's losses over a long run, held to the incumbent's window by window.

    A bf16 trajectory leaves an fp32 one step by step: each batch's loss moves with the weights'
    rounding, and on a noisy data stream single steps differ by more than any honest per-step
    tolerance (cifar_resnet's bf16 autocast: one step of 53 off by 6.1%, windows of 6 steps within
    2.2%). So past the steps validation compares one by one, the means of consecutive windows of
    `window` steps are compared, each held to `rtol`: per-step noise averages out, and a change of
    the math (a term dropped from step K + 1 on) still moves every window after it.
    """
    n = min(len(baseline), len(candidate))
    base = {"precision": "low_precision", "rtol": rtol, "steps_compared": n}
    for i in range(n):
        x, y = baseline[i], candidate[i]
        if x is None or not math.isfinite(x):
            return LossVerdict(passed=False, reason=f"step {i + 1}: incumbent loss is {x}: no reference", **base)
        if y is None or not math.isfinite(y):
            return LossVerdict(passed=False, reason=f"step {i + 1}: candidate loss is {y}", worst_step=i + 1, **base)
    window = max(2, window)
    worst = None
    for start in range(0, n, window):
        end = min(n, start + window)
        if end - start < 2 and start > 0:
            break  # a last window of one step is one step, not a mean
        b = sum(baseline[start:end]) / (end - start)
        c = sum(candidate[start:end]) / (end - start)
        rel = _rel(c, b)
        if worst is None or rel > worst[0]:
            worst = (rel, start, end, b, c)
    rel, start, end, b, c = worst
    detail = {"worst_step": end, "worst_baseline_loss": b, "worst_candidate_loss": c, "worst_rel_diff": rel,
              "tolerance": rtol}
    if rel > rtol:
        return LossVerdict(passed=False, reason=(f"steps {start + 1}-{end}: mean candidate loss {c:.6g} vs {b:.6g}: "
                                                 f"rel diff {rel:.2e} > low_precision tolerance {rtol:.2e} "
                                                 f"(means of {window}-step windows)"), **base, **detail)
    return LossVerdict(passed=True, reason=(f"{n} steps within low_precision tolerance {rtol:.2e} as means of "
                                            f"{window}-step windows (worst {rel:.2e}, steps {start + 1}-{end})"),
                       **base, **detail)
