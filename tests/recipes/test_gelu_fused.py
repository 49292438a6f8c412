"""gelu_fused: hand-written GELUs in the spellings programs use, recognised by their values,
replaced by the fused operator with the program's own form (tanh or erf); near misses refused."""

import textwrap

import pytest
import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable
from trainbridge.agent.rewriters.recipes_gelu import gelu_form

from tests.kits import recipe_testkit as kit
from tests.kits.paths import FIXTURES
from tests.kits.recipe_testkit import applied as _apply
from tests.kits.recipe_testkit import output_and_grads as _run

SPELLINGS = {
    "tanh_pow_math_constants": ("tanh", """
        def act(x):
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    """),
    "tanh_literal_constant_cubed_by_products": ("tanh", """
        def act(x):
            return x * 0.5 * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    """),
    "tanh_split_over_statements_method_pow": ("tanh", """
        def act(x):
            inner = x + 0.044715 * x.pow(3)
            t = torch.tanh(math.sqrt(2 / math.pi) * inner)
            return 0.5 * x * (1 + t)
    """),
    "tanh_named_constant": ("tanh", """
        def act(x):
            c = math.sqrt(2.0 / torch.pi)
            return 0.5 * x * (1.0 + (c * (x + 0.044715 * x ** 3)).tanh())
    """),
    "erf_divided_by_sqrt2": ("none", """
        def act(x):
            return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
    """),
    "erf_times_inverse_sqrt2_factor_last": ("none", """
        def act(x):
            return (1 + torch.erf(x * 0.7071067811865476)) * x / 2
    """),
}
HEADER = "import math\nimport torch\nimport torch.nn.functional as F\n"


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_each_spelling_becomes_the_fused_gelu_of_its_own_form(spelling):
    form, body = SPELLINGS[spelling]
    src = HEADER + textwrap.dedent(body)
    new, out = _apply("gelu_fused", src, "cpu")
    assert [s.detail["approximate"] for s in out.sites] == [form]
    assert "tanh(" not in new and "erf(" not in new and "0.044715" not in new, new
    assert ('approximate="tanh"' in new) == (form == "tanh")
    a, b = kit.load(src), kit.load(new)
    x = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
    kit.assert_close_and_aligned(_run(a["act"], x), _run(b["act"], x), atol=1e-12, rtol=1e-12)


NEAR_MISSES = {
    "wrong_cubic_coefficient": """
        def act(x):
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.05 * x ** 3)))
    """,
    "two_operands": """
        def act(x, y):
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y ** 3)))
    """,
    "tanh_softcap_not_gelu": """
        def act(x):
            return 30.0 * torch.tanh(x / 30.0)
    """,
}


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_near_misses_are_left_alone(case):
    out = RECIPES["gelu_fused"].apply({"p.py": HEADER + textwrap.dedent(NEAR_MISSES[case])}, "cpu")
    assert isinstance(out, NotApplicable) and "no expression computing GELU" in out.reason


def test_the_operand_is_called_once_and_its_statement_kept_when_it_has_effects():
    """gelu(self.fc(x)) through a local name: the module call stays where it was, once."""
    src = HEADER + textwrap.dedent("""
        class MLP(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(8, 8)

            def forward(self, x):
                h = self.fc(x)
                return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
    """)
    new, out = _apply("gelu_fused", src, "cpu")
    assert "h = self.fc(x)" in new and 'F.gelu(h, approximate="tanh")' in new and new.count("self.fc(") == 1


def test_the_form_is_told_apart_by_value():
    assert gelu_form("(0.5 * _v0 * (1 + _erf(_v0 / _sqrt(2))))") == "none"
    assert gelu_form("(0.5 * _v0 * (1 + _tanh(0.7978845608 * (_v0 + 0.044715 * _pow(_v0, 3)))))") == "tanh"
    assert gelu_form("(_v0 * _tanh(_v0))") is None


@pytest.mark.parametrize("npu", kit.NPU_KINDS)
def test_npu_gets_npu_gelu_with_the_programs_form(npu):
    src = HEADER + textwrap.dedent(SPELLINGS["erf_divided_by_sqrt2"][1])
    new, out = _apply("gelu_fused", src, "npu")
    assert 'torch_npu.npu_gelu(x, approximate="none")' in new and "import torch_npu" in new
    a = kit.load(src)
    x = torch.randn(16, 8, requires_grad=True)
    with kit.fake_npu(npu):
        b = kit.load(new)
        kit.assert_close_and_aligned(_run(a["act"], x), _run(b["act"], x))


def test_the_single_file_trainers_gelu_is_found():
    src = (FIXTURES / "loop" / "dropgpt" / "train.py").read_text()
    new, out = _apply("gelu_fused", src, "cpu", "train.py")
    assert [s.qualname for s in out.sites] == ["new_gelu"]
    assert 'return F.gelu(x, approximate="tanh")' in new


def test_a_bias_gelu_over_a_local_sum_is_the_gelu_of_that_sum():
    """Framework style: `x = bias + y` then GELU of `x` with the erf constant written out. Read
    through `x`, the expression is arithmetic over two operands; GELU is found over `x` itself."""
    src = HEADER + textwrap.dedent("""
        def bias_gelu(bias, y):
            x = bias + y
            return x * 0.5 * (1.0 + torch.erf(x * 0.70710678))
    """)
    new, out = _apply("gelu_fused", src, "cpu")
    assert [s.detail["approximate"] for s in out.sites] == ["none"] and "x = bias + y" in new, new
    assert "erf(" not in new
    a, b = kit.load(src), kit.load(new)
    bias = torch.randn(32, dtype=torch.float64, requires_grad=True)
    y = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
    # the written constant is 1/sqrt(2) to 8 digits (the outputs agree to 5e-10); the bias's gradient
    # sums 64 rows of such differences
    kit.assert_close_and_aligned(_run(a["bias_gelu"], bias, y), _run(b["bias_gelu"], bias, y), atol=1e-6, rtol=1e-6)
