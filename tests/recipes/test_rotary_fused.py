"""rotary_fused: the cpu rewrite of the NeoX convention is exact, the npu variant's r1/r2 tables
reproduce each rotate-half convention, partial rotations are refused."""

import pytest
import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable

from tests.kits import recipe_testkit as kit
from tests.kits.recipe_testkit import applied as _apply

IDIOMS = kit.read("idioms_gpt.py")


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


def test_rotary_not_applicable_for_partial_or_other_splits():
    src = ("import torch\ndef f(x, cos, sin):\n    x1, x2 = x[..., :16], x[..., 16:]\n"
           "    return torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], dim=-1)\n")  # d not provably D/2
    out = RECIPES["rotary_fused"].apply({"p.py": src}, "cpu")
    assert isinstance(out, NotApplicable) and "rotary" in out.reason
    assert isinstance(RECIPES["rotary_fused"].apply({"p.py": kit.read("plain_mlp.py")}, "npu"), NotApplicable)
