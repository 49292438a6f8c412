"""rms_norm_fused and rotary_fused: they apply to nanogpt and to other idioms, the result parses
and computes the same (forward and gradients), npu variants checked against torch_npu stand-ins."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "programs"))
import recipe_testkit as kit  # noqa: E402

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable, RewriteProposal  # noqa: E402

IDIOMS = kit.read("idioms_gpt.py")
NANO = kit.nanogpt_source()
needs_nanogpt = pytest.mark.skipif(NANO is None, reason="workloads/nanogpt/train_gpt.py not present")


def _apply(name, src, target, file="p.py"):
    out = kit.apply(name, src, target, file=file)
    assert isinstance(out, RewriteProposal), out
    return out.files[file], out


# ---------------------------------------------------------------- rms_norm ----

NORM_VARIANTS = {
    "chained_pow": "def f(x, eps=1e-6):\n    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)\n",
    "square_dim_kw": "def f(x):\n    return x * torch.rsqrt(torch.square(x).mean(dim=-1, keepdim=True) + 1e-5)\n",
    "mul_self_split": ("def f(x):\n    v = (x * x).mean(dim=-1, keepdim=True)\n    r = torch.rsqrt(v + 1e-6)\n"
                       "    return r * x\n"),
    "div_sqrt": "def f(x):\n    return x / torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + 1e-6)\n",
    "neg_half_power": "def f(x):\n    return x * (x.pow(2).mean(-1, keepdim=True) + 1e-6) ** -0.5\n",
    "method_rsqrt_outer_weight": "def f(x, w):\n    return w * (x * (1e-6 + x.square().mean(-1, keepdim=True)).rsqrt())\n",
    "hf_style_reassigned": ("def f(h):\n    dt = h.dtype\n    h = h.to(torch.float32)\n"
                            "    var = h.pow(2).mean(-1, keepdim=True)\n    h = h * torch.rsqrt(var + 1e-6)\n"
                            "    return h.to(dt)\n"),
}


@pytest.mark.parametrize("variant", NORM_VARIANTS)
def test_rms_norm_variants_are_fused_and_equal(variant):
    src = "import torch\n" + NORM_VARIANTS[variant]
    new, out = _apply("rms_norm_fused", src, "cpu")
    assert "rms_norm(" in new and "rsqrt" not in new and "sqrt(" not in new
    a, b = kit.load(src), kit.load(new)
    x = torch.randn(3, 5, 16, requires_grad=True)
    args = (x, torch.rand(16) + 0.5) if "w" in out.sites[0].detail.get("outer_factors", "") or "w)" in src else (x,)
    ya, yb = a["f"](*args), b["f"](*args)
    ga, = torch.autograd.grad(kit.proj(ya), x)
    gb, = torch.autograd.grad(kit.proj(yb), x)
    kit.assert_close_and_aligned([ya, ga], [yb, gb])


def test_rms_norm_keeps_eps_explicit_and_fuses_a_parameter_weight():
    new, out = _apply("rms_norm_fused", IDIOMS, "cpu")
    site = out.sites[0]
    assert site.qualname == "ScaledRMSNorm.forward" and site.detail["weight"] == "self.scale"
    assert "_tb_rms_norm(h, self.scale, self.eps)" in new  # eps passed: F.rms_norm's default is not the program's
    a, b = kit.load(IDIOMS), kit.load(new)
    for dtype in (torch.float32, torch.bfloat16):  # bf16 activation with an fp32 weight promotes, like eager
        torch.manual_seed(0); ma = a["ScaledRMSNorm"](16)
        torch.manual_seed(0); mb = b["ScaledRMSNorm"](16)
        with torch.no_grad():
            ma.scale.uniform_(0.5, 1.5); mb.scale.copy_(ma.scale)
        x = torch.randn(4, 16, dtype=dtype, requires_grad=True)
        ya, yb = ma(x), mb(x)
        assert ya.dtype == yb.dtype
        kit.proj(ya.float()).backward(); gxa = x.grad.clone(); x.grad = None
        kit.proj(yb.float()).backward(); gxb = x.grad.clone()
        tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        kit.assert_close_and_aligned([ya, gxa, ma.scale.grad], [yb, gxb, mb.scale.grad], **tol,
                                     cos_min=0.9999 if dtype == torch.float32 else 0.999)


@pytest.mark.parametrize("npu", kit.NPU_KINDS)
def test_rms_norm_npu_variant_matches_eager(npu):
    new, out = _apply("rms_norm_fused", IDIOMS, "npu")
    assert "torch_npu.npu_rms_norm(h, self.scale.to(h.dtype), epsilon=self.eps)[0]" in new
    src = "import torch\n" + NORM_VARIANTS["chained_pow"]
    new2, _ = _apply("rms_norm_fused", src, "npu")
    assert "_tb_npu_rms_gamma(x)" in new2  # no weight: a cached all-ones gamma
    with kit.fake_npu(npu):
        a, b = kit.load(src), kit.load(new2)
        x = torch.randn(2, 3, 8, requires_grad=True)
        ya, yb = a["f"](x), b["f"](x)
        ga, = torch.autograd.grad(kit.proj(ya), x)
        gb, = torch.autograd.grad(kit.proj(yb), x)
        assert b["_tb_npu_rms_gamma"](x) is b["_tb_npu_rms_gamma"](x)  # cached
    kit.assert_close_and_aligned([ya, ga], [yb, gb])


def test_rms_norm_not_applicable_without_the_pattern():
    srcs = ["import torch\ndef f(x):\n    return x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6)\n",  # not last dim
            "import torch\ndef f(x, y):\n    return y * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)\n",  # other tensor
            "import torch\ndef f(x):\n    return torch.nn.functional.rms_norm(x, (4,), eps=1e-6)\n",  # already fused
            kit.read("plain_mlp.py")]
    for src in srcs:
        out = RECIPES["rms_norm_fused"].apply({"p.py": src}, "cpu")
        assert isinstance(out, NotApplicable) and "RMSNorm" in out.reason


# ------------------------------------------------------------------ rotary ----

def _tables(T=6, D=8):
    f = torch.outer(torch.arange(T).float(), torch.rand(D // 2))
    return f.cos()[None, :, None, :], f.sin()[None, :, None, :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_cpu_rewrite_of_the_neox_convention_is_exact(dtype):
    new, out = _apply("rotary_fused", IDIOMS, "cpu")
    assert [s.qualname for s in out.sites] == ["rope"] and ".roll(" in new
    a, b = kit.load(IDIOMS), kit.load(new)
    cos, sin = _tables()
    x = torch.randn(2, 6, 3, 8, dtype=dtype, requires_grad=True)
    ya, yb = a["rope"](x, cos, sin), b["rope"](x, cos, sin)
    torch.testing.assert_close(yb, ya, atol=0, rtol=0)  # the same products and the same single add
    ga, = torch.autograd.grad(kit.proj(ya.float()), x)
    gb, = torch.autograd.grad(kit.proj(yb.float()), x)
    kit.assert_close_and_aligned([ga], [gb], atol=1e-5 if dtype == torch.float32 else 3e-2, rtol=1e-4 if dtype == torch.float32 else 3e-2)


@pytest.mark.parametrize("npu", kit.NPU_KINDS)
def test_rotary_npu_tables_follow_rotate_half_convention(npu):
    """npu_rotary_mul computes x*r1 + cat(-x2, x1)*r2: the recipe's r1/r2 must reproduce each convention."""
    new, out = _apply("rotary_fused", IDIOMS, "npu")
    assert {s.qualname for s in out.sites} == {"rope", "rope_full"}
    a = kit.load(IDIOMS)
    cos, sin = _tables()
    x = torch.randn(2, 6, 3, 8, requires_grad=True)
    with kit.fake_npu(npu):
        b = kit.load(new)
        for fn, tables in (("rope", (cos, sin)), ("rope_full", (torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)))):
            ya, yb = a[fn](x, *tables), b[fn](x, *tables)
            ga, = torch.autograd.grad(kit.proj(ya), x)
            gb, = torch.autograd.grad(kit.proj(yb), x)
            kit.assert_close_and_aligned([ya, ga], [yb, gb])


@needs_nanogpt
@pytest.mark.parametrize("target", ["cpu", "npu"])
def test_rotary_and_norm_on_nanogpt_whole_model(target):
    for name in ("rms_norm_fused", "rotary_fused"):
        new, out = _apply(name, NANO, target, "train_gpt.py")
        assert out.sites
        npu = "standin" if target == "npu" else None
        la, ga = kit.nanogpt_loss_and_grads(NANO)
        lb, gb = kit.nanogpt_loss_and_grads(new, npu=npu)
        kit.assert_close_and_aligned([la, *ga], [lb, *gb], atol=2e-5, rtol=2e-4)


def test_rotary_not_applicable_for_partial_or_other_splits():
    src = ("import torch\ndef f(x, cos, sin):\n    x1, x2 = x[..., :16], x[..., 16:]\n"
           "    return torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], dim=-1)\n")  # d not provably D/2
    out = RECIPES["rotary_fused"].apply({"p.py": src}, "cpu")
    assert isinstance(out, NotApplicable) and "rotary" in out.reason
    assert isinstance(RECIPES["rotary_fused"].apply({"p.py": kit.read("plain_mlp.py")}, "npu"), NotApplicable)
