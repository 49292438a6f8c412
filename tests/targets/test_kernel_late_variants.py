"""Replacements for the kernel variants of the newest records (87-89).

Record 87 stores only post = relu(pre)^2 and rebuilds relu(pre) as sqrt(post) in the
backward; record 88 adds a prefix-token prediction to the run-time-compiled cross-entropy;
record 89 sizes a tile-maximum buffer for its full-size weights. Each replacement is checked
against an independent reading (the NVRTC reference, the pre/post variant it must agree with)
and a subtly wrong version must fail the same comparison.
"""

from __future__ import annotations

import torch

from trainbridge.targets.kernels import cases, nvrtc_reference
from trainbridge.targets.kernels.catalog import match_launcher
from trainbridge.targets.kernels.compare import compare
from trainbridge.targets.shims import shim_source

SHIM: dict = {}
exec(compile(shim_source("kernels"), "_tb_kernels.py", "exec"), SHIM)

PREFIX_PARAMS = ["logits", "targets", "mtp_weights", "prefix_targets", "prefix_weight", "losses", "grad_input",
                 "n_rows", "n_predict", "A", "B", "C", "grad_s", "grad_scale"]


def _watch_equal(got, want) -> bool:
    return all(compare("c", name, got.watch[name], want.watch[name]).passed for name in ("losses", "grad_input"))


def test_prefix_cross_entropy_matches_the_independent_reference_and_a_wrong_weight_does_not():
    for n_predict in (3, 1):
        want = cases.ce_fwd_bwd_prefix(0, rows=30, vocab=200, n_predict=n_predict)
        got = cases.ce_fwd_bwd_prefix(0, rows=30, vocab=200, n_predict=n_predict)
        nvrtc_reference.ce_fwd_bwd_prefix(*want.args)
        SHIM["ce_fwd_bwd_prefix"](*got.args)
        assert _watch_equal(got, want), n_predict
    want = cases.ce_fwd_bwd_prefix(1, rows=30, vocab=200)
    wrong = cases.ce_fwd_bwd_prefix(1, rows=30, vocab=200)
    nvrtc_reference.ce_fwd_bwd_prefix(*want.args)
    args = list(wrong.args)
    args[4] = args[4] * 2  # the prefix weight counted twice
    SHIM["ce_fwd_bwd_prefix"](*args)
    assert not _watch_equal(wrong, want)


def test_prefix_cross_entropy_without_prefix_targets_is_the_plain_kernel():
    with_prefix = cases.ce_fwd_bwd_prefix(2, rows=30, vocab=200)
    args = list(with_prefix.args)
    args[3] = torch.full_like(args[3], -1)  # no row has a prefix token
    SHIM["ce_fwd_bwd_prefix"](*args)
    plain = cases.ce_fwd_bwd(2, rows=30, vocab=200)
    nvrtc_reference.ce_fwd_bwd(*plain.args)
    assert _watch_equal(with_prefix, plain)


def test_the_prefix_launcher_finds_its_entry_and_the_plain_one_keeps_its_own():
    prefix = match_launcher("ce_fwd_bwd", PREFIX_PARAMS, ["acd06bec82719cb9"])
    assert prefix.entry is not None and prefix.entry.replacement == "ce_fwd_bwd_prefix"
    plain_params = [p for p in PREFIX_PARAMS if not p.startswith("prefix")]
    assert match_launcher("ce_fwd_bwd", plain_params, ["11c40e491daec60e"]).entry.replacement == "ce_fwd_bwd"
    assert match_launcher("ce_fwd_bwd", PREFIX_PARAMS, ["11c40e491daec60e"]).entry is None  # kernel and params disagree


def test_post_only_relu_square_agrees_with_the_pre_post_variant_forward_and_backward():
    fwd = cases.linear_relu_square_post_only(0, rows=64, dim=64, hidden=96)
    post = SHIM["linear_relu_square_post_only"](*fwd.args)
    pre, post_ref = SHIM["linear_relu_square"](*fwd.args)
    assert torch.equal(post, post_ref)
    g = torch.Generator().manual_seed(3)
    grad = torch.randn(64, 64, generator=g).to(torch.bfloat16)
    w2 = (torch.randn(96, 64, generator=g) * 0.125).to(torch.bfloat16)
    from_post = SHIM["linear_relu_square_post_only"](grad, w2, aux=post)
    from_pre = SHIM["linear_relu_square"](grad, w2, aux=pre)
    # sqrt(bf16(relu(pre)^2)) is relu(pre) to bf16 precision: the two gradients agree within it
    assert compare("c", "dpre", from_post, from_pre).passed
    wrong = 2 * (grad @ w2.T).to(torch.bfloat16).float() * post.float()  # forgot the square root
    assert not compare("c", "dpre", wrong.to(torch.bfloat16), from_pre).passed
    assert match_launcher("linear_relu_square", ["a", "b", "aux"], ["b6c020e63d5045e8"]).entry.replacement == \
        "linear_relu_square_post_only"


def test_a_tile_maximum_buffer_sized_for_the_full_model_gives_the_same_scales():
    exact = cases.quantize_transpose_mlp_down_weights(0)
    weights, out, next_scales, used, partial = exact.args
    SHIM["quantize_transpose_mlp_down_weights"](*exact.args)
    roomy = cases.quantize_transpose_mlp_down_weights(0)
    w2, out2, next2, used2, partial2 = roomy.args
    big = torch.full((partial2.shape[0], partial2.shape[1] + 11), 7.0)  # stale values past the last tile
    SHIM["quantize_transpose_mlp_down_weights"](w2, out2, next2, used2, big)
    assert torch.equal(next2, next_scales) and torch.equal(used2, used)
    assert torch.equal(out2.float(), out.float())
    assert torch.equal(big[:, :partial.shape[1]], partial) and not big[:, partial.shape[1]:].any()
