"""The elementwise-work counter (harness.elementwise), op by op.

Fusion must not look like deleted work: each fused or library spelling of a region counts
within a quarter of the eager spelling it replaces (torch's decompositions are not the
hand-written ones), while deleting a near-identity op removes its share outright. The count
never changes a value, an op it cannot see into is named, and the optimizer's update is left
out (a fused optimizer is one opaque kernel).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainbridge.harness.elementwise import ElementwiseCounter
from trainbridge.harness.runner import run_workload
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES

B, T, C, H = 4, 16, 64, 4
torch.manual_seed(0)
X = torch.randn(B, T, C)
W = torch.rand(C) + 0.5
QKV = [torch.randn(B, H, T, C // H) for _ in range(3)]
TARGETS = torch.randint(0, C, (B * T,))


def _eager_attention(q, k, v):
    att = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    att = att.masked_fill(torch.tril(torch.ones(T, T, dtype=torch.bool)).logical_not(), float("-inf"))
    return F.softmax(att, dim=-1) @ v


def _eager_cross_entropy(x):
    logp = x.view(-1, C) - torch.logsumexp(x.view(-1, C), dim=-1, keepdim=True)
    return -logp.gather(1, TARGETS[:, None]).mean()


SPELLINGS = {  # region: (eager spelling, fused or library spelling, inputs)
    "rms_norm": (lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * W,
                 lambda x: F.rms_norm(x, (C,), W, 1e-6), [X]),
    "layer_norm": (lambda x: (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False)
                                                                         + 1e-5) * W,
                   lambda x: F.layer_norm(x, (C,), W, None, 1e-5), [X]),
    "gelu_tanh": (lambda x: 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x ** 3))),
                  lambda x: F.gelu(x, approximate="tanh"), [X]),
    "silu": (lambda x: x * torch.sigmoid(x), F.silu, [X]),
    "attention": (_eager_attention, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), QKV),
    "cross_entropy": (_eager_cross_entropy, lambda x: F.cross_entropy(x.view(-1, C), TARGETS), [X]),
}


def _count(fn, inputs) -> tuple[ElementwiseCounter, torch.Tensor, list[torch.Tensor]]:
    leaves = [t.clone().requires_grad_() for t in inputs]
    with ElementwiseCounter() as counter:
        out = fn(*leaves)
        out.sum().backward()
    return counter, out.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("region", SPELLINGS)
def test_a_fused_spelling_counts_as_the_eager_work_it_replaces(region):
    eager, fused, inputs = SPELLINGS[region]
    ce, out_e, _ = _count(eager, inputs)
    cf, out_f, _ = _count(fused, inputs)
    torch.testing.assert_close(out_f, out_e, atol=1e-4, rtol=1e-4)  # the same math, spelled twice
    ratio = cf.total / ce.total
    assert 0.75 <= ratio <= 1.3, (region, ce.by_op, cf.by_op)
    assert not cf.opaque and not ce.opaque, (cf.opaque, ce.opaque)


def test_deleting_a_softcap_removes_its_share():
    softcap, _, _ = _count(lambda x: 30 * torch.tanh(x / 30), [X])
    gone, _, _ = _count(lambda x: x * 1.0, [X])
    assert gone.total < 0.5 * softcap.total and "tanh" not in gone.by_op and softcap.by_op["tanh"] == X.numel()


def test_counting_changes_no_value():
    eager, _, inputs = SPELLINGS["layer_norm"]
    _, out, grads = _count(eager, inputs)
    leaf = inputs[0].clone().requires_grad_()
    plain = eager(leaf)
    plain.sum().backward()
    assert torch.equal(out, plain.detach()) and torch.equal(grads[0], leaf.grad)


def test_an_op_with_no_decomposition_is_named_opaque():
    lib = torch.library.Library("tbcount", "DEF")  # noqa: TOR901 - a kernel torch knows nothing about
    lib.define("vendor_scale(Tensor x) -> Tensor")
    lib.impl("vendor_scale", lambda x: x * 2.0, "CPU")
    with ElementwiseCounter() as counter:
        torch.ops.tbcount.vendor_scale(X)
    assert counter.opaque == {"tbcount.vendor_scale": 1} and counter.total == 0


def test_the_optimizer_update_is_left_out_of_the_step(tmp_path):
    tiny = load_workload(FIXTURES / "harness" / "tiny")
    runs = {}
    for mode in ("normal", "fused_adam"):
        wl = tiny.model_copy(update={"manifest": tiny.manifest.model_copy(update={"args": [mode]})})
        runs[mode] = run_workload(wl, "cpu", out_dir=tmp_path / mode, warmup_steps=1, measured_steps=1,
                                  count_flops=True)
        assert runs[mode].status == "ok", runs[mode].error
    loop, fused = runs["normal"].elementwise_per_step, runs["fused_adam"].elementwise_per_step
    assert loop.total > 0 and loop.by_op.get("logsumexp", 0) + loop.by_op.get("exp", 0) > 0  # the loss is in
    assert fused.total == loop.total and not fused.opaque, (loop, fused)
