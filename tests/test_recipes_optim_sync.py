"""fused_optimizer and remove_host_sync: where they apply, what they change, what they refuse."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "programs"))
import recipe_testkit as kit  # noqa: E402

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable, RewriteProposal  # noqa: E402

IDIOMS = kit.read("idioms_gpt.py")
NANO = kit.nanogpt_source()
needs_nanogpt = pytest.mark.skipif(NANO is None, reason="workloads/nanogpt/train_gpt.py not present")


def _apply(name, src, target, file="p.py"):
    out = kit.apply(name, src, target, file=file)
    assert isinstance(out, RewriteProposal), out
    return out.files[file], out


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


# ---------------------------------------------------------------- optimizer ----

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


# ---------------------------------------------------------------- host sync ----

def _log():
    lines = []
    return lines, lines.append


def test_host_sync_guards_per_step_logging_and_moves_conditional_reads():
    new, out = _apply("remove_host_sync", IDIOMS, "npu")
    kinds = {s.qualname: s.detail["kind"] for s in out.sites}
    assert kinds == {"train": "guard", "train_logging_every": "move"}  # train_with_control_flow: lv feeds a break
    assert "if it % _TB_LOG_EVERY == 0:" in new and "_TB_LOG_EVERY = 10" in new
    a, b = kit.load(IDIOMS), kit.load(new)
    la, loga = _log(); lb, logb = _log()
    pa, pb = _params(a["train"](steps=12, log=loga)), _params(b["train"](steps=12, log=logb))
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))  # training untouched
    assert len(la) == 12 and lb == [la[0], la[10]]  # only logging steps read the device value
    la, loga = _log(); lb, logb = _log()
    a["train_logging_every"](steps=6, log=loga); b["train_logging_every"](steps=6, log=logb)
    assert la == lb  # already conditional: the output is unchanged


def test_host_sync_is_not_a_cpu_recipe_and_refuses_control_flow_uses():
    out = RECIPES["remove_host_sync"].apply({"p.py": IDIOMS}, "cpu")
    assert isinstance(out, NotApplicable) and "synchronously" in out.reason
    # the program with only its control-flow loop (the value read decides a break)
    only_cf = IDIOMS.split("def train(")[0] + "def train_with_control_flow" + IDIOMS.split("def train_with_control_flow")[1]
    out = RECIPES["remove_host_sync"].apply({"p.py": only_cf}, "npu")
    assert isinstance(out, NotApplicable) and "lv feeds something other than a log line" in out.reason


@needs_nanogpt
def test_host_sync_on_nanogpt_keeps_protected_regions():
    import tomllib

    from trainbridge.agent.guard import check_candidate
    from trainbridge.workload import Manifest

    man = Manifest.model_validate(tomllib.loads((kit.NANOGPT.parent / "trainbridge.toml").read_text()))
    files = {"train_gpt.py": NANO}
    out = RECIPES["remove_host_sync"].apply(files, "npu", protected=man.protected)
    assert isinstance(out, RewriteProposal), out
    assert out.sites[0].qualname == "main"
    assert check_candidate(files, out.files, man.protected, man.editable, "npu").passed
