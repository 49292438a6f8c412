"""fused_optimizer: fused=True on the cpu, NpuFused optimizers (and every zero_grad) on the npu;
where it applies, what it changes, what it refuses."""

import pytest

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable, RewriteProposal

from tests.kits import recipe_testkit as kit
from tests.kits.recipe_testkit import applied as _apply
from tests.kits.recipe_testkit import needs_nanogpt
from tests.kits.recipe_testkit import params_of as _params

IDIOMS = kit.read("idioms_gpt.py")
NANO = kit.nanogpt_source()


def test_fused_optimizer_recipe_and_npu_variant():
    src = "import torch\nopt = torch.optim.AdamW(params, lr=1e-3)\nsgd = torch.optim.SGD(params, lr=0.1, foreach=False)\n"
    cpu = RECIPES["fused_optimizer"].apply({"p.py": src}, "cpu").files["p.py"]
    assert "AdamW(params, lr=1e-3, fused=True)" in cpu and "foreach=False" in cpu  # explicit choice kept
    npu = RECIPES["fused_optimizer"].apply({"p.py": src}, "npu").files["p.py"]
    assert "torch_npu.optim.NpuFusedAdamW(params" in npu and "import torch_npu" in npu


def test_fused_optimizer_cpu_matches_the_for_loop_optimizer():
    new, out = _apply("fused_optimizer", IDIOMS, "cpu")
    assert {s.detail["optimizer"] for s in out.sites} == {"Adam", "AdamW", "SGD"}  # `from torch import optim` spelling
    assert "optim.Adam(model.parameters(), lr=1e-3, fused=True)" in new
    a, b = kit.load(IDIOMS), kit.load(new)
    pa, pb = _params(a["train"](steps=3, log=lambda s: None)), _params(b["train"](steps=3, log=lambda s: None))
    kit.assert_close_and_aligned(pa, pb, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("npu", kit.NPU_KINDS)
def test_fused_optimizer_npu_rewrites_every_zero_grad(npu):
    new, out = _apply("fused_optimizer", IDIOMS, "npu")
    assert "torch_npu.optim.NpuFusedAdam(model.parameters(), lr=1e-3)" in new
    assert "zero_grad(set_to_none=True)" not in new and new.count("zero_grad(set_to_none=False)") == 3
    assert any("set_to_none=False" in n for n in out.notes)
    a = kit.load(IDIOMS)
    ref = _params(a["train"](steps=3, log=lambda s: None))
    with kit.fake_npu(npu):
        b = kit.load(new)
        got = _params(b["train"](steps=3, log=lambda s: None))
        # without the zero_grad rewrite the fused optimizer refuses (documented caveat)
        naive = IDIOMS.replace("optim.Adam(model.parameters(), lr=1e-3)", "torch_npu.optim.NpuFusedAdam(model.parameters(), lr=1e-3)")
        naive = naive.replace("import torch\n", "import torch\nimport torch_npu\n", 1)
        with pytest.raises(Exception, match="set_to_none"):
            kit.load(naive)["train"](steps=2, log=lambda s: None)
    kit.assert_close_and_aligned(ref, got, atol=1e-5, rtol=1e-4)


@needs_nanogpt
def test_fused_optimizer_on_nanogpt():
    new, out = _apply("fused_optimizer", NANO, "cpu", "train_gpt.py")
    assert [s.detail["optimizer"] for s in out.sites] == ["AdamW"] and "fused=True" in new
    new_npu, _ = _apply("fused_optimizer", NANO, "npu", "train_gpt.py")
    assert "torch_npu.optim.NpuFusedAdamW(" in new_npu and "zero_grad(set_to_none=True)" not in new_npu


def test_fused_optimizer_not_applicable_when_the_choice_is_made():
    out = RECIPES["fused_optimizer"].apply({"p.py": kit.read("plain_mlp.py")}, "cpu")
    assert isinstance(out, NotApplicable) and "fused" in out.reason
    odd = "import torch\nopt = torch.optim.AdamW(ps, lr=1e-3, maximize=True)\n"
    assert isinstance(RECIPES["fused_optimizer"].apply({"p.py": odd}, "npu"), NotApplicable)  # NpuFused has no maximize
    assert isinstance(RECIPES["fused_optimizer"].apply({"p.py": odd}, "cpu"), RewriteProposal)


HELPER = '''
import inspect
import torch

def configure_optimizers(model, weight_decay, learning_rate, betas, device_type):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused_available = "fused" in inspect.signature(torch.optim.AdamW).parameters
    use_fused = fused_available and device_type == "cuda"
    extra_args = dict(fused=True) if use_fused else dict()
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **extra_args)

model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
opt = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), DEVICE_TYPE)
'''


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_a_helper_that_passes_fused_through_extra_args_is_not_given_fused_twice(device_type):
    # the single-file-trainer form: param groups, a helper, and `**extra_args` that already holds
    # fused=True when the program thinks it is on cuda; adding fused=True beside it would raise
    src = HELPER.replace("DEVICE_TYPE", repr(device_type))
    new, out = _apply("fused_optimizer", src, "cpu")
    assert len(out.sites) == 1 and out.sites[0].qualname == "configure_optimizers"
    assert '**{**extra_args, "fused": True, "foreach": None}' in new
    opt = kit.load(new)["opt"]  # builds: no "multiple values for keyword argument 'fused'"
    assert all(g["fused"] is True for g in opt.param_groups) and len(opt.param_groups) == 2


def test_npu_leaves_a_construction_with_a_keyword_dict_alone():
    src = HELPER.replace("DEVICE_TYPE", "'cuda'")
    out = RECIPES["fused_optimizer"].apply({"p.py": src}, "npu")
    assert isinstance(out, NotApplicable)
