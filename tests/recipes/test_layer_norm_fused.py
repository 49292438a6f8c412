"""layer_norm_fused: hand-written LayerNorms in the spellings programs use, recognised by their
values (the roles of input, weight, bias and eps found by evaluation), replaced by F.layer_norm;
norms over another dimension, the unbiased variance and an RMSNorm are left alone."""

import textwrap

import pytest
import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable

from tests.kits import recipe_testkit as kit
from tests.kits.recipe_testkit import applied as _apply
from tests.kits.recipe_testkit import output_and_grads as _run

HEADER = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"

SPELLINGS = {
    "var_unbiased_false_weight_bias_eps_attribute": """
        class LN(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.weight, self.bias, self.eps = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d)), 1e-5

            def forward(self, x):
                mu = x.mean(-1, keepdim=True)
                var = x.var(-1, keepdim=True, unbiased=False)
                return (x - mu) / torch.sqrt(var + self.eps) * self.weight + self.bias
    """,
    "mean_of_squared_deviations_rsqrt_literal_eps": """
        class LN(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.g, self.b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

            def forward(self, x):
                c = x - x.mean(dim=-1, keepdim=True)
                return self.g * (c * torch.rsqrt((c ** 2).mean(dim=-1, keepdim=True) + 1e-6)) + self.b
    """,
    "no_affine_torch_functions": """
        class LN(nn.Module):
            def __init__(self, d):
                super().__init__()

            def forward(self, x):
                m = torch.mean(x, dim=-1, keepdim=True)
                v = torch.mean(torch.square(x - m), dim=-1, keepdim=True)
                return (x - m) / torch.sqrt(v + 1e-5)
    """,
}


def _trained(module_cls, d=16):
    torch.manual_seed(0)
    m = module_cls(d).double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_each_spelling_becomes_f_layer_norm_and_computes_the_same(spelling):
    src = HEADER + textwrap.dedent(SPELLINGS[spelling])
    new, out = _apply("layer_norm_fused", src, "cpu")
    assert [s.qualname for s in out.sites] == ["LN.forward"], out.sites
    assert "F.layer_norm(x, (x.size(-1),)" in new and "sqrt(" not in new and "mean(" not in new, new
    a, b = kit.load(src), kit.load(new)
    ma, mb = _trained(a["LN"]), _trained(b["LN"])
    x = torch.randn(4, 7, 16, dtype=torch.float64, requires_grad=True) * 3 + 1
    kit.assert_close_and_aligned(_run(ma, x), _run(mb, x), atol=1e-10, rtol=1e-10)


def test_roles_and_eps_are_named():
    src = HEADER + textwrap.dedent(SPELLINGS["var_unbiased_false_weight_bias_eps_attribute"])
    _, out = _apply("layer_norm_fused", src, "cpu")
    d = out.sites[0].detail
    assert (d["weight"], d["bias"], d["eps"]) == ("self.weight", "self.bias", "self.eps")
    src = HEADER + textwrap.dedent(SPELLINGS["mean_of_squared_deviations_rsqrt_literal_eps"])
    _, out = _apply("layer_norm_fused", src, "cpu")
    assert out.sites[0].detail["eps"] == "1e-6" and out.sites[0].detail["weight"] == "self.g"


NEAR_MISSES = {
    "unbiased_variance": """
        def ln(x, eps):
            return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + eps)
    """,
    "over_the_first_dimension": """
        def ln(x, eps):
            mu = x.mean(0, keepdim=True)
            return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(0, keepdim=True) + eps)
    """,
    "rms_norm_is_not_layer_norm": """
        def ln(x, eps):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    """,
    "eps_outside_the_root": """
        def ln(x, eps):
            return (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True, unbiased=False).sqrt() + eps)
    """,
}


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_near_misses_are_left_alone(case):
    out = RECIPES["layer_norm_fused"].apply({"p.py": HEADER + textwrap.dedent(NEAR_MISSES[case])}, "cpu")
    assert isinstance(out, NotApplicable) and "no expression computing LayerNorm" in out.reason
