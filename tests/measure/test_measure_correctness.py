"""Loss trajectories and region (lab) checks, each tried with the attack it must stop."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trainbridge.measure.correctness import compare_losses, lab_check, step_tolerance

STEPS = 8
BASE = [4.0 - 0.15 * i + 0.01 * (-1) ** i for i in range(STEPS)] + [2.5, 2.4]  # more steps than compared


def cmp(candidate, *, low_precision=False, baseline=BASE):
    return compare_losses(baseline, candidate, rtol_fp32=2e-3, rtol_low_precision=4e-2,
                          low_precision=low_precision, steps=STEPS)


# ----------------------------------------------------------------- losses ----
def test_identical_passes():
    v = cmp(list(BASE))
    assert v.passed and v.worst_rel_diff == 0.0 and v.steps_compared == STEPS, v.reason


def test_small_fp32_noise_passes():
    v = cmp([x * (1 + 1e-5 * (-1) ** i) for i, x in enumerate(BASE)])
    assert v.passed and v.precision == "fp32" and v.worst_rel_diff < 2e-5, v.reason


def test_ten_percent_drift_fails_naming_the_step():
    v = cmp([x * (1 + 0.10 * i / (STEPS - 1)) for i, x in enumerate(BASE)])
    assert not v.passed and v.worst_step is not None
    assert f"step {v.worst_step}" in v.reason and "tolerance" in v.reason
    assert v.worst_baseline_loss == BASE[v.worst_step - 1] and v.tolerance == 2e-3
    assert not cmp([x * (1 + 0.10 * i / (STEPS - 1)) for i, x in enumerate(BASE)], low_precision=True).passed


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_fails(bad):
    c = list(BASE)
    c[3] = bad
    v = cmp(c)
    assert not v.passed and "step 4" in v.reason and str(bad) in v.reason


def test_missing_loss_fails():
    c = list(BASE)
    c[2] = None
    v = cmp(c)
    assert not v.passed and "step 3: candidate loss missing" in v.reason


def test_fewer_steps_fail():
    v = cmp(BASE[:5])
    assert not v.passed and "5 of 8" in v.reason


def test_zero_loss_fails():
    v = cmp([0.0] * len(BASE))
    assert not v.passed and "exactly 0" in v.reason
    c = list(BASE)
    c[5] = 0.0  # one zeroed step is enough
    assert not cmp(c).passed


def test_constant_loss_fails():
    v = cmp([BASE[0]] * len(BASE))  # first step right, then the cached value forever
    assert not v.passed and "constant" in v.reason and "cached" in v.reason


def test_constant_candidate_is_fine_when_the_baseline_is_constant_too():
    flat = [3.0] * 10
    assert cmp(list(flat), baseline=flat).passed


def test_bf16_level_noise_passes_only_with_low_precision():
    noisy = [x * (1 + 0.01 * (-1) ** i) for i, x in enumerate(BASE)]  # ~1%: bf16 has 8 mantissa bits
    strict = cmp(noisy)
    assert not strict.passed and strict.precision == "fp32"
    loose = cmp(noisy, low_precision=True)
    assert loose.passed and loose.precision == "low_precision", loose.reason


def test_low_precision_tolerance_grows_with_the_step():
    assert step_tolerance(0.04, 1, 8, True) == pytest.approx(0.045)
    assert step_tolerance(0.04, 8, 8, True) == pytest.approx(0.08)
    assert step_tolerance(0.002, 8, 8, False) == 0.002


def test_low_precision_systematic_drift_fails_on_the_last_steps_mean():
    # +5% on the last three steps sits inside the widened per-step band (7-8%) but the mean of
    # the last few losses is held to the base 4%.
    c = [x * (1.05 if i >= STEPS - 3 else 1.0) for i, x in enumerate(BASE)]
    v = cmp(c, low_precision=True)
    assert not v.passed and "mean of the last 3" in v.reason, v.reason


def test_baseline_without_losses_is_reported_as_such():
    b = list(BASE)
    b[0] = None
    v = cmp(list(BASE), baseline=b)
    assert not v.passed and "baseline" in v.reason


# -------------------------------------------------------------- lab check ----
D = 64
EPS = 1e-6


def ref_rms(x, w):
    return F.rms_norm(x, (D,), w, EPS)


def hand_rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def inputs(dtype=torch.float32, scale=1.0):
    def make(gen):
        x = (torch.randn(4, 8, D, generator=gen) * scale).to(dtype).requires_grad_()
        w = (1 + 0.1 * torch.randn(D, generator=gen)).to(dtype).requires_grad_()
        return x, w
    return make


def test_exact_equivalent_passes():
    v = lab_check(ref_rms, hand_rms, inputs(), dtype=torch.float32)
    assert v.passed, v.reason
    assert v.max_abs_err < 1e-5 and v.min_grad_cosine > 0.9999 and len(v.trial_results) == 3


def test_bf16_equivalent_passes_within_bf16_tolerance():
    def upcast(x, w):  # the usual reference-style bf16 RMSNorm: math in fp32
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w
    v = lab_check(ref_rms, upcast, inputs(torch.bfloat16), dtype=torch.bfloat16)
    assert v.passed and v.rtol == 2**-7 and v.dtype == "bfloat16", v.reason



def test_an_output_in_a_coarser_dtype_than_its_inputs_is_held_to_its_own_precision():
    """fp32 arguments, bf16 math and result (Newton-Schulz's form): the same math in a
    different order differs by bf16 rounding, which fp32's tolerance would call wrong."""
    def ref(x, w):
        return ref_rms(x, w).bfloat16()

    def reordered(x, w):
        return (x.bfloat16() * w.bfloat16()) * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS).bfloat16()

    def wrong(x, w):
        return (x * w).bfloat16()

    assert lab_check(ref, reordered, inputs(), dtype=torch.float32).passed
    v = lab_check(ref, wrong, inputs(), dtype=torch.float32)
    assert not v.passed and "rtol 0.0078125" in v.reason, v.reason

def test_wrong_axis_fails():
    v = lab_check(ref_rms, lambda x, w: x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + EPS) * w, inputs())
    assert not v.passed and "forward error" in v.reason


def test_missing_eps_fails_where_eps_matters():
    def no_eps(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) * w
    v = lab_check(ref_rms, no_eps, inputs(scale=1e-3))  # mean square ~ eps
    assert not v.passed and "forward error" in v.reason


def test_zeros_fail():
    v = lab_check(ref_rms, lambda x, w: torch.zeros_like(x), inputs())
    assert not v.passed and "all zeros" in v.reason


def test_cached_output_fails_on_fresh_inputs():
    cache = {}

    def cached(x, w):  # keeps its graph so only fresh inputs can expose it
        cache.setdefault("out", ref_rms(x, w))
        return cache["out"]
    v = lab_check(ref_rms, cached, inputs())
    assert not v.passed and v.reason.startswith("trial 1:") and "forward error" in v.reason


def test_inputs_that_do_not_change_fail():
    fixed = lambda gen: (torch.ones(2, D, requires_grad=True), torch.ones(D, requires_grad=True))  # noqa: E731
    v = lab_check(ref_rms, hand_rms, fixed)
    assert not v.passed and "same inputs" in v.reason


def test_detached_output_fails():
    v = lab_check(ref_rms, lambda x, w: ref_rms(x, w).detach(), inputs())
    assert not v.passed and "detached" in v.reason


def test_missing_input_gradient_fails():
    v = lab_check(ref_rms, lambda x, w: ref_rms(x.detach(), w), inputs())
    assert not v.passed and "input 0: candidate gives no gradient" in v.reason


def test_scaled_gradient_fails_although_cosine_is_one():
    def doubled_grad(x, w):
        y = ref_rms(x, w)
        return y + (y - y.detach())  # same forward, twice the gradient
    v = lab_check(ref_rms, doubled_grad, inputs())
    assert not v.passed and "norm ratio" in v.reason


def test_changed_output_dtype_fails():
    v = lab_check(ref_rms, lambda x, w: hand_rms(x.float(), w.float()), inputs(torch.bfloat16), dtype=torch.bfloat16)
    assert not v.passed and "float32" in v.reason


def test_candidate_that_raises_is_a_verdict():
    def broken(x, w):
        raise RuntimeError("kernel launch failed")
    v = lab_check(ref_rms, broken, inputs())
    assert not v.passed and "RuntimeError: kernel launch failed" in v.reason


# ---------------------------------------------------------------- long low-precision runs ----
def _walk(n=53, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return list(2.3 * np.exp(-0.01 * np.arange(n)) * np.exp(rng.normal(0, 0.03, n)))


def test_a_bf16_run_that_wanders_step_by_step_passes_as_window_means():
    """cifar_resnet's bf16 autocast against its fp32 port, 53 timed steps: one step 6.1% off, the
    rest within ~3%; 6-step window means within 2.2%. Per step it failed at step 17."""
    import numpy as np

    from trainbridge.measure.correctness import compare_loss_windows

    base = _walk()
    rng = np.random.default_rng(1)
    cand = [b * (1 + rng.normal(0, 0.012)) for b in base]
    cand[16] = base[16] * 0.939  # the one step 6.1% off
    per_step = compare_losses(base, cand, rtol_fp32=1e-3, rtol_low_precision=0.045, low_precision=True, steps=53)
    assert not per_step.passed and "step 17" in per_step.reason
    windows = compare_loss_windows(base, cand, window=6, rtol=0.045)
    assert windows.passed, windows.reason


def test_a_change_of_the_math_after_the_validated_steps_moves_every_window():
    from trainbridge.measure.correctness import compare_loss_windows

    base = _walk()
    cand = base[:6] + [b * 0.94 for b in base[6:]]  # from step 7 on, a term dropped: 6% lower
    got = compare_loss_windows(base, cand, window=6, rtol=0.045)
    assert not got.passed and "rel diff 6.00e-02" in got.reason
    nan = base[:20] + [float("nan")] + base[21:]
    assert "step 21" in compare_loss_windows(base, nan, window=6, rtol=0.045).reason
