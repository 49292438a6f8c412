"""swiglu_fused / geglu_fused: gated units `act(a) * b` in the forms programs write them (two
projections, one projection chunked or sliced in halves, the activation called or written by
hand), fused on npu (npu_swiglu / npu_geglu, checked against the torch_npu stand-in and the
references) and, on cpu, a hand-written SiLU as F.silu; near misses left alone."""

import textwrap

import pytest
import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable
from trainbridge.agent.rewriters.recipes_glu import activation_by_value

from tests.kits import recipe_testkit as kit
from tests.kits.recipe_testkit import applied as _apply
from tests.kits.recipe_testkit import output_and_grads as _run

HEADER = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


_LAYERS = "self.w1 = nn.Linear(8, 16)\nself.w3 = nn.Linear(8, 16)\nself.w12 = nn.Linear(8, 32)"


def _mlp(forward: str, init: str = _LAYERS):
    init = textwrap.indent(textwrap.dedent(init), " " * 8)
    return HEADER + textwrap.dedent("""
        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
        {init}

            def forward(self, x):
        {forward}
    """).format(init=init, forward=textwrap.indent(textwrap.dedent(forward).strip(), " " * 8))


def _assert_same_mlp(src: str, new: str, npu: str) -> None:
    """The rewritten MLP, with the original's weights, gives its outputs and gradients."""
    torch.manual_seed(0)
    a = kit.load(src)["MLP"]()
    with kit.fake_npu(npu):
        b = kit.load(new)["MLP"]()
    b.load_state_dict(a.state_dict())
    x = torch.randn(4, 8, requires_grad=True)
    with kit.fake_npu(npu):
        kit.assert_close_and_aligned(_run(a, x) + kit.grads_of(a), _run(b, x) + kit.grads_of(b))


SWIGLU = {  # name -> (forward, what the npu call reads)
    "two_projections_llama": ("return F.silu(self.w1(x)) * self.w3(x)", "torch.cat([self.w1(x), self.w3(x)], dim=-1)"),
    "chunk_of_a_local": ("""
        h = self.w12(x)
        a, b = h.chunk(2, dim=-1)
        return F.silu(a) * b
    """, "npu_swiglu(h, dim=-1)"),
    "torch_chunk_value_first": ("""
        h = self.w12(x)
        gate, up = torch.chunk(h, 2, dim=-1)
        return up * torch.nn.functional.silu(gate)
    """, "npu_swiglu(h, dim=-1)"),
    "slices_and_a_hand_written_silu": ("""
        h = self.w12(x)
        d = h.shape[-1] // 2
        a = h[..., :d]
        b = h[..., d:]
        return a * torch.sigmoid(a) * b
    """, "npu_swiglu(h, dim=-1)"),
    "silu_through_a_local_name_exp_form": ("""
        g = self.w1(x)
        act = g / (1 + torch.exp(-g))
        return act * self.w3(x)
    """, "torch.cat([g, self.w3(x)], dim=-1)"),
    "chunk_of_a_module_call": ("""
        a, b = self.w12(x).chunk(2, dim=-1)
        return F.silu(a) * b
    """, "torch.cat([a, b], dim=-1)"),
}


@pytest.mark.parametrize("npu", kit.NPU_KINDS)
@pytest.mark.parametrize("form", SWIGLU)
def test_npu_swiglu_in_each_form_computes_the_same(form, npu):
    forward, reads = SWIGLU[form]
    src = _mlp(forward)
    new, out = _apply("swiglu_fused", src, "npu")
    assert "torch_npu.npu_swiglu(" in new and reads in new, new
    assert "import torch_npu" in new and "silu(" not in new and "sigmoid" not in new and "exp(" not in new, new
    _assert_same_mlp(src, new, npu)


GEGLU = {  # name -> (forward, expected call)
    "gelu_on_the_value_half_default_right": ("""
        h = self.w12(x)
        a, b = h.chunk(2, dim=-1)
        return a * F.gelu(b)
    """, "torch_npu.npu_geglu(h, dim=-1, approximate=0)[0]"),
    "tanh_gelu_by_hand_on_the_left_half": ("""
        h = self.w12(x)
        a, b = h.chunk(2, dim=-1)
        g = 0.5 * a * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a ** 3)))
        return g * b
    """, "torch_npu.npu_geglu(h, dim=-1, approximate=1, activate_left=True)[0]"),
    "two_projections": ("return F.gelu(self.w1(x), approximate=\"tanh\") * self.w3(x)",
                        "npu_geglu(torch.cat([self.w1(x), self.w3(x)], dim=-1), dim=-1, approximate=1, "
                        "activate_left=True)[0]"),
}


@pytest.mark.parametrize("npu", kit.NPU_KINDS)
@pytest.mark.parametrize("form", GEGLU)
def test_npu_geglu_keeps_the_programs_form_and_half(form, npu):
    forward, call = GEGLU[form]
    src = _mlp(forward)
    new, out = _apply("geglu_fused", src, "npu")
    assert call in new and "F.gelu" not in new and "tanh(" not in new, new
    _assert_same_mlp(src, new, npu)


NEAR_MISSES = {
    "a_scale_not_a_gate": "return F.silu(self.w1(x)) * 2.0",
    "a_parameter_scale_not_a_gate": "return F.silu(self.w1(x)) * self.w1.bias",
    "gated_by_its_own_input": "h = self.w1(x)\nreturn F.silu(h) * h",
    "sigmoid_gating_is_glu_not_swiglu": "return torch.sigmoid(self.w1(x)) * self.w3(x)",
    "silu_of_the_second_half_times_the_first": "h = self.w12(x)\na, b = h.chunk(2, dim=-1)\nreturn a * F.silu(b)",
}


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_npu_near_misses_are_left_alone(case):
    out = RECIPES["swiglu_fused"].apply({"p.py": _mlp(NEAR_MISSES[case])}, "npu")
    assert isinstance(out, NotApplicable) and "no silu(a) * b gated unit" in out.reason, out


HAND_SILU = {
    "x_times_sigmoid": "return x * torch.sigmoid(x)",
    "sigmoid_method_first": "return x.sigmoid() * x",
    "over_one_plus_exp": "return x / (1.0 + torch.exp(-x))",
}


@pytest.mark.parametrize("spelling", HAND_SILU)
def test_cpu_a_hand_written_silu_becomes_f_silu(spelling):
    src = HEADER + f"def act(x):\n    {HAND_SILU[spelling]}\n"
    new, out = _apply("swiglu_fused", src, "cpu")
    assert "return F.silu(x)" in new and "sigmoid" not in new and "exp(" not in new, new
    a, b = kit.load(src), kit.load(new)
    x = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
    kit.assert_close_and_aligned(_run(a["act"], x), _run(b["act"], x), atol=1e-12, rtol=1e-12)


def test_cpu_the_gate_of_a_hand_written_swiglu_is_fused_and_the_module_calls_stay_once():
    src = _mlp("g = self.w1(x)\nreturn g * torch.sigmoid(g) * self.w3(x)")
    new, _ = _apply("swiglu_fused", src, "cpu")
    assert "return F.silu(g) * self.w3(x)" in new and new.count("self.w1(") == 1, new


def test_cpu_a_program_that_already_calls_silu_has_nothing_to_change():
    out = RECIPES["swiglu_fused"].apply({"p.py": _mlp(SWIGLU["two_projections_llama"][0])}, "cpu")
    assert isinstance(out, NotApplicable) and "nothing to fuse on cpu" in out.reason


def test_geglu_is_npu_only_and_says_why():
    out = RECIPES["geglu_fused"].apply({"p.py": _mlp(GEGLU["two_projections"][0])}, "cpu")
    assert isinstance(out, NotApplicable) and "no fused GELU-gated unit" in out.reason


def test_activations_are_told_apart_by_value():
    assert activation_by_value("(_v0 * _sigmoid(_v0))", "_v0") == "silu"
    assert activation_by_value("(_v0 / (1 + _exp((-_v0))))", "_v0") == "silu"
    assert activation_by_value("(_v0 * _sigmoid((1.702 * _v0)))", "_v0") is None  # quick GELU: neither
    assert activation_by_value("(0.5 * _v0 * (1 + _erf(_v0 / _sqrt(2))))", "_v0") == "gelu:none"


def test_the_llama_workloads_feed_forward_becomes_npu_swiglu():
    from tests.kits.paths import WORKLOADS

    src = (WORKLOADS / "llama" / "train_llama.py").read_text()
    new, out = _apply("swiglu_fused", src, "npu", "train_llama.py")
    assert [s.qualname for s in out.sites] == ["FeedForward.forward"], out.sites
    assert "torch_npu.npu_swiglu(torch.cat([self.w1(x), self.w3(x)], dim=-1), dim=-1)" in new
