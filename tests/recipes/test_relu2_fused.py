"""relu2_fused: relu(x)^2 in its spellings, bit-identical forward and gradient, the linear
evaluated once when the square is split over statements, clear refusals."""

import pytest
import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable

from tests.kits import recipe_testkit as kit
from tests.kits.recipe_testkit import applied as _apply
from tests.kits.recipe_testkit import needs_nanogpt
from tests.kits.recipe_testkit import output_and_grads as _run

IDIOMS = kit.read("idioms_gpt.py")
NANO = kit.nanogpt_source()


RELU2 = {
    "method_square": "def f(x):\n    return F.relu(x).square()\n",
    "pow": "def f(x):\n    return torch.relu(x).pow(2)\n",
    "power_op": "def f(x):\n    return torch.relu(x) ** 2\n",
    "torch_square": "def f(x):\n    return torch.square(F.relu(x))\n",
    "split_mul": "def f(x):\n    r = x.relu()\n    return r * r\n",
}


@pytest.mark.parametrize("variant", RELU2)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_relu2_variants_are_bit_identical(variant, dtype):
    src = "import torch\nimport torch.nn.functional as F\n" + RELU2[variant]
    new, _ = _apply("relu2_fused", src, "cpu")
    assert "_tb_relu_square(x)" in new
    a, b = kit.load(src), kit.load(new)
    x = torch.randn(64, 32, dtype=dtype)
    x[0, :4] = 0.0  # relu's kink
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = a["f"](xa), b["f"](xb)
    g = torch.randn_like(ya)
    ya.backward(g); yb.backward(g)
    assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)


def test_relu2_split_over_statements_keeps_the_linear_once():
    new, out = _apply("relu2_fused", IDIOMS, "cpu")
    assert {s.qualname for s in out.sites} == {"FFN.forward", "squared_relu"}
    assert "h = self.up(x)\n        h = _tb_relu_square(h)" in new  # self.up(x) is not evaluated twice
    a, b = kit.load(IDIOMS), kit.load(new)
    torch.manual_seed(0); ma = a["FFN"]()
    torch.manual_seed(0); mb = b["FFN"]()
    x = torch.randn(3, 32, requires_grad=True)
    kit.assert_close_and_aligned(_run(ma, x), _run(mb, x))


@needs_nanogpt
def test_relu2_on_nanogpt_whole_model():
    new, out = _apply("relu2_fused", NANO, "cpu", "train_gpt.py")
    assert out.sites[0].qualname == "MLP.forward"
    la, ga = kit.nanogpt_loss_and_grads(NANO)
    lb, gb = kit.nanogpt_loss_and_grads(new)
    kit.assert_close_and_aligned([la, *ga], [lb, *gb], atol=1e-6, rtol=1e-5)


def test_relu2_not_applicable():
    for src in ["import torch\ndef f(x):\n    return torch.relu(x, inplace=True) ** 2\n" .replace("torch.relu", "torch.nn.functional.relu"),
                "import torch\ndef f(x):\n    return torch.relu(x) ** 3\n", kit.read("plain_mlp.py")]:
        out = RECIPES["relu2_fused"].apply({"p.py": src}, "cpu")
        assert isinstance(out, NotApplicable) and "relu(x)^2" in out.reason
