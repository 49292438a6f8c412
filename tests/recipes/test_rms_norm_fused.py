"""rms_norm_fused: it applies to nanogpt's and other RMSNorm idioms, the result parses and
computes the same (forward and gradients), the npu variant checked against torch_npu stand-ins."""

import textwrap

import pytest
import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable

from tests.kits import recipe_testkit as kit
from tests.kits.recipe_testkit import applied as _apply
from tests.kits.recipe_testkit import exec_ns as _ns

torch.manual_seed(0)

IDIOMS = kit.read("idioms_gpt.py")


NORM_IDIOMS = {
    "chained_function": """
        import torch
        def norm(x, eps=1e-6):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    """,
    "split_method_with_weight": """
        import torch
        class RMSNorm(torch.nn.Module):
            def __init__(self, d, eps=1e-5):
                super().__init__()
                self.eps = eps
                self.weight = torch.nn.Parameter(torch.rand(d) + 0.5)
            def forward(self, hidden):
                variance = (hidden * hidden).mean(dim=-1, keepdim=True)
                return hidden * torch.rsqrt(variance + self.eps) * self.weight
    """,
    "power_and_method_rsqrt": """
        import torch
        def rms(t, w):
            ms = torch.mean(t ** 2, dim=-1, keepdim=True)
            inv = (ms + 1e-5).rsqrt()
            return w * (t * inv)
    """,
    "division_by_sqrt": """
        import torch
        def rms(t):
            return t / torch.sqrt(torch.square(t).mean(-1, keepdim=True) + 1e-6)
    """,
}


@pytest.mark.parametrize("idiom", NORM_IDIOMS)
def test_rms_norm_recipe_on_idioms(idiom):
    src = textwrap.dedent(NORM_IDIOMS[idiom])
    out = RECIPES["rms_norm_fused"].apply({"p.py": src}, "cpu")
    assert not isinstance(out, NotApplicable), out
    new = out.files["p.py"]
    assert "rms_norm" in new and "rsqrt" not in new and "sqrt(" not in new
    a, b = _ns(src), _ns(new)
    x = torch.randn(3, 5, 16, requires_grad=True)
    if idiom == "split_method_with_weight":
        torch.manual_seed(1); ma = a["RMSNorm"](16)
        torch.manual_seed(1); mb = b["RMSNorm"](16)
        ya, yb = ma(x), mb(x)
    elif idiom == "power_and_method_rsqrt":
        w = torch.rand(16) + 0.5
        ya, yb = a["rms"](x, w), b["rms"](x, w)
    else:
        fn = next(k for k in ("norm", "rms") if k in a)
        ya, yb = a[fn](x), b[fn](x)
    torch.testing.assert_close(yb, ya, atol=1e-5, rtol=1e-5)
    ga, = torch.autograd.grad(ya.sum(), x)
    gb, = torch.autograd.grad(yb.sum(), x)
    torch.testing.assert_close(gb, ga, atol=1e-5, rtol=1e-5)


def test_rms_norm_recipe_not_applicable_without_the_pattern():
    src = "import torch\ndef f(x):\n    return x.mean(-1, keepdim=True)\n"
    assert isinstance(RECIPES["rms_norm_fused"].apply({"p.py": src}, "cpu"), NotApplicable)


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
