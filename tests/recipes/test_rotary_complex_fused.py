"""rotary_complex_fused: complex-number rotary (Meta-Llama style, and the same written with
`.view`, a bf16 input, the product's factors swapped, `torch.flatten`) as npu_rotary_mul in
'interleave' mode, equal in value and gradient to the original on the stand-in and the
reference; forms it must not touch are left alone; not a cpu/cuda recipe."""

import textwrap

import pytest
import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable

from tests.kits import recipe_testkit as kit
from tests.kits.recipe_testkit import applied as _apply
from tests.kits.recipe_testkit import output_and_grads as _run

HEADER = "import torch\n"
META = """
    def freqs(head_dim, end, theta=10000.0):
        f = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
        t = torch.arange(end).float()
        return torch.polar(torch.ones(end, head_dim // 2), torch.outer(t, f))

    def reshape_for_broadcast(freqs_cis, x):
        shape = [d if i == 1 or i == x.ndim - 1 else 1 for i, d in enumerate(x.shape)]
        return freqs_cis.view(*shape)

    def rope(xq, xk, freqs_cis):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
        xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
        xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)
"""
VIEW_SWAPPED = """
    def freqs(head_dim, end, theta=10000.0):
        f = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
        return torch.polar(torch.ones(end, head_dim // 2), torch.outer(torch.arange(end).float(), f))

    def rope(xq, xk, freqs_cis):
        fc = freqs_cis[None, :, None, :]
        q = torch.flatten(torch.view_as_real(fc * torch.view_as_complex(xq.float().view(*xq.shape[:-1], -1, 2))), 3)
        k = torch.view_as_real(torch.view_as_complex(xk.float().view(*xk.shape[:-1], -1, 2)) * fc).flatten(-2)
        return q.type_as(xq), k.type_as(xk)
"""
FORMS = {"meta_llama": META, "view_swapped_torch_flatten": VIEW_SWAPPED}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("npu", kit.NPU_KINDS)
@pytest.mark.parametrize("form", FORMS)
def test_complex_rotary_becomes_npu_rotary_mul_interleave(form, npu, dtype):
    src = HEADER + textwrap.dedent(FORMS[form])
    new, out = _apply("rotary_complex_fused", src, "npu")
    assert len(out.sites) == 2 and new.count('rotary_mode="interleave"') == 2, new
    assert "view_as_real" not in new and "xk_ =" not in new, new  # xq_ stays: reshape_for_broadcast reads it
    a = kit.load(src)
    with kit.fake_npu(npu):
        b = kit.load(new)
    xq = torch.randn(2, 6, 3, 8, dtype=dtype, requires_grad=True)
    xk = torch.randn(2, 6, 3, 8, dtype=dtype, requires_grad=True)
    fc = a["freqs"](8, 6)

    def both(m):
        q, k = m["rope"](xq, xk, fc)
        return torch.cat([q, k], dim=-1)

    with kit.fake_npu(npu):
        kit.assert_close_and_aligned(_run(lambda x, y: both(a), xq, xk), _run(lambda x, y: both(b), xq, xk),
                                     **({} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2, "cos_min": 0.999}))


NOT_THIS = {
    "half_split_real_rotary": """
        def rope(x, cos, sin):
            x1, x2 = x.chunk(2, dim=-1)
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    """,
    "complex_times_complex_input": """
        def rope(xq, freqs_cis):
            a = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
            return torch.view_as_real(a * torch.view_as_complex(freqs_cis.reshape(*freqs_cis.shape[:-1], -1, 2))).flatten(3)
    """,
    "pairs_not_last_two": """
        def rope(xq, freqs_cis):
            a = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], 2, -1))
            return torch.view_as_real(a * freqs_cis).flatten(3)
    """,
}


@pytest.mark.parametrize("case", NOT_THIS)
def test_other_forms_are_left_alone(case):
    out = RECIPES["rotary_complex_fused"].apply({"p.py": HEADER + textwrap.dedent(NOT_THIS[case])}, "npu")
    assert isinstance(out, NotApplicable) and "no view_as_real" in out.reason, out


def test_not_offered_on_cpu_or_cuda():
    for target in ("cpu", "cuda"):
        out = RECIPES["rotary_complex_fused"].apply({"p.py": HEADER + textwrap.dedent(META)}, target)
        assert isinstance(out, NotApplicable) and "one kernel" in out.reason


def test_the_llama_workloads_rotary_is_found():
    from tests.kits.paths import WORKLOADS

    src = (WORKLOADS / "llama" / "train_llama.py").read_text()
    new, out = _apply("rotary_complex_fused", src, "npu", "train_llama.py")
    assert [s.qualname for s in out.sites] == ["apply_rotary_emb", "apply_rotary_emb"], out.sites
    assert 'torch_npu.npu_rotary_mul(xq.float(), freqs_cis.real.repeat_interleave(2, dim=-1)' in new
