"""softcap_ce_fused: the logit softcap and the cross-entropy moved into one compiled region
(cpu) or npu_cross_entropy_loss (npu); same loss and gradients; clear refusals.

Compiled regions are checked with Dynamo's eager backend and fullgraph=True (see
recipe_testkit.eager_compile).
"""

import pytest
import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable

from tests.kits import recipe_testkit as kit
from tests.kits.recipe_testkit import applied_at as _apply
from tests.kits.recipe_testkit import needs_nanogpt

IDIOMS = kit.read("idioms_gpt.py")
NANO = kit.nanogpt_source()


def test_softcap_ce_compiled_region_on_other_idioms():
    new, out = _apply("softcap_ce_fused", IDIOMS, "cpu")
    assert "def _tb_softcap_cross_entropy(z, cap, y):" in new and "return _tb_softcap_cross_entropy(z, cap, y)" in new
    assert new.count("z = (z / cap).tanh() * cap") == 1  # moved, not copied
    a = kit.load(IDIOMS)
    with kit.eager_compile():
        b = kit.load(new)
        torch.manual_seed(0); ma = a["Model"]()
        torch.manual_seed(0); mb = b["Model"]()
        idx = torch.randint(0, 48, (2, 8)); y = torch.randint(0, 48, (2, 8)); y[0, 0] = -1  # ignore_index kept
        la, lb = ma(idx, y), mb(idx, y)
        la.backward(); lb.backward()
    kit.assert_close_and_aligned([la, *kit.grads_of(ma)], [lb, *kit.grads_of(mb)])


@needs_nanogpt
@pytest.mark.parametrize("target", ["cpu", "npu"])
def test_softcap_ce_on_nanogpt_whole_model(target):
    new, out = _apply("softcap_ce_fused", NANO, target, None, "train_gpt.py")
    assert out.sites[0].qualname == "GPT.forward"
    la, ga = kit.nanogpt_loss_and_grads(NANO)
    if target == "cpu":
        with kit.eager_compile():
            lb, gb = kit.nanogpt_loss_and_grads(new)
    else:
        assert "npu_cross_entropy_loss(" in new and ".reshape(())" in new
        for npu in kit.NPU_KINDS:
            lb, gb = kit.nanogpt_loss_and_grads(new, npu=npu)
            assert lb.shape == la.shape  # the op's [1]-shaped loss is given the 0-d shape back
            kit.assert_close_and_aligned([la, *ga], [lb, *gb])
        return
    kit.assert_close_and_aligned([la, *ga], [lb, *gb])


def test_softcap_ce_not_applicable():
    twice = ("import torch\nimport torch.nn.functional as F\ndef f(z, y):\n    z = 30 * torch.tanh(z / 30)\n"
             "    return F.cross_entropy(z.view(-1, z.size(-1)), y.view(-1)), z\n")
    out = RECIPES["softcap_ce_fused"].apply({"p.py": twice}, "cpu")
    assert isinstance(out, NotApplicable) and "softcap" in out.reason
    plain = "import torch\nimport torch.nn.functional as F\ndef f(z, y):\n    return F.cross_entropy(z, y)\n"
    assert isinstance(RECIPES["softcap_ce_fused"].apply({"p.py": plain}, "cpu"), NotApplicable)
    three_d = ("import torch\nimport torch.nn.functional as F\ndef f(z, y):\n    z = 30 * torch.tanh(z / 30)\n"
               "    return F.cross_entropy(z.transpose(1, 2), y)\n")
    out = RECIPES["softcap_ce_fused"].apply({"p.py": three_d}, "npu")
    assert isinstance(out, NotApplicable) and "[N, C]" in out.reason
