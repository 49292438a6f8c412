"""Recipes match the shape of the code, not nanogpt's text; rewritten code computes the same thing."""

import textwrap

import pytest
import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable

torch.manual_seed(0)

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


def _ns(src):
    ns = {}
    exec(compile(src, "<prog>", "exec"), ns)
    return ns


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


ATTENTION_IDIOMS = {
    "operator_matmul_masked_fill_buffer": """
        import math, torch
        def attn(q, k, v, mask):
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(mask, float("-inf"))
            att = att.softmax(dim=-1)
            y = att @ v
            return y
    """,
    "torch_matmul_divide_tril_chained_output": """
        import torch
        import torch.nn.functional as F
        def attn(q, k, v, mask):
            scores = torch.matmul(q, k.transpose(-1, -2)) / (k.size(-1) ** 0.5)
            scores = scores.masked_fill(~mask, float("-inf"))
            probs = F.softmax(scores, dim=-1)
            return_value = torch.matmul(probs, v).transpose(1, 2)
            return return_value
    """,
}


@pytest.mark.parametrize("idiom", ATTENTION_IDIOMS)
def test_attention_recipe_on_idioms(idiom):
    src = textwrap.dedent(ATTENTION_IDIOMS[idiom])
    out = RECIPES["sdpa_attention"].apply({"p.py": src}, "cpu")
    assert not isinstance(out, NotApplicable), out
    new = out.files["p.py"]
    assert "scaled_dot_product_attention" in new and "softmax" not in new
    a, b = _ns(src), _ns(new)
    q, k, v = (torch.randn(2, 3, 8, 4, requires_grad=True) for _ in range(3))
    T = 8
    triu = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    mask = triu if "buffer" in idiom else ~triu  # second idiom masks where the tril mask is False
    ya, yb = a["attn"](q, k, v, mask), b["attn"](q, k, v, mask)
    torch.testing.assert_close(yb, ya, atol=1e-5, rtol=1e-5)


def test_attention_with_dropout_is_not_rewritten():
    src = textwrap.dedent("""
        import torch
        def attn(q, k, v, mask, drop):
            att = (q @ k.transpose(-2, -1)) * 0.5
            att = att.masked_fill(mask, float("-inf"))
            att = att.softmax(dim=-1)
            att = drop(att)
            y = att @ v
            return y
    """)
    out = RECIPES["sdpa_attention"].apply({"p.py": src}, "cpu")
    assert isinstance(out, NotApplicable)


def test_autocast_recipe_points_gpu_autocast_at_target():
    src = "import torch\nwith torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n    pass\n"
    out = RECIPES["autocast_reapply"].apply({"p.py": src}, "cpu")
    assert "device_type='cpu'" in out.files["p.py"]
    npu = RECIPES["autocast_reapply"].apply({"p.py": src}, "npu")
    assert "device_type='npu'" in npu.files["p.py"]
    assert isinstance(RECIPES["autocast_reapply"].apply({"p.py": "import torch\n"}, "cpu"), NotApplicable)


def test_fused_optimizer_recipe_and_npu_variant():
    src = "import torch\nopt = torch.optim.AdamW(params, lr=1e-3)\nsgd = torch.optim.SGD(params, lr=0.1, foreach=False)\n"
    cpu = RECIPES["fused_optimizer"].apply({"p.py": src}, "cpu").files["p.py"]
    assert "AdamW(params, lr=1e-3, fused=True)" in cpu and "foreach=False" in cpu  # explicit choice kept
    npu = RECIPES["fused_optimizer"].apply({"p.py": src}, "npu").files["p.py"]
    assert "torch_npu.optim.NpuFusedAdamW(params" in npu and "import torch_npu" in npu


def test_compile_region_wraps_exactly_one_function():
    src = textwrap.dedent("""
        import torch
        def zeropower_via_newtonschulz5(G):
            return G
        def rotary(x):
            return x
        def main():
            pass
    """)
    r = RECIPES["compile_region"]
    sites = [s.qualname for s in r.find({"p.py": src}, "cpu")]
    assert sites == ["zeropower_via_newtonschulz5", "rotary"]
    new = r.apply({"p.py": src}, "cpu", "rotary").files["p.py"]
    assert new.count("@torch.compile") == 1 and new.index("@torch.compile") < new.index("def rotary")
