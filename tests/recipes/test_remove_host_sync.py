"""remove_host_sync: per-step logging of a device value guarded to every Nth step, conditional
reads moved; not a cpu recipe; control-flow uses and protected regions left alone."""

import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable, RewriteProposal

from tests.kits import recipe_testkit as kit
from tests.kits.recipe_testkit import applied as _apply
from tests.kits.recipe_testkit import needs_nanogpt
from tests.kits.recipe_testkit import params_of as _params

IDIOMS = kit.read("idioms_gpt.py")
NANO = kit.nanogpt_source()


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


def test_a_log_line_that_reads_a_second_device_value_keeps_the_guarded_read():
    """Llama's loop: `train_loss = loss.item()` then one print of train_loss and grad_norm.item().
    The read's plan and the print's own `.item()` once both replaced the print, the second
    without the read: the candidate died with NameError train_loss."""
    src = kit.read("idioms_gpt.py").split("def train(")[0] + '''
def train(steps, log):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        loss = model(torch.ones(2, 4)).pow(2).mean()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        train_loss = loss.item()
        print(f"step {step} loss {train_loss:.4f} grad_norm {grad_norm.item():.4f}")
    return model
'''
    new, out = _apply("remove_host_sync", src, "npu")
    assert len(out.sites) == 1 and out.sites[0].detail["kind"] == "guard", out.sites
    guarded = new.split("if step % _TB_LOG_EVERY == 0:")[1]
    assert "train_loss = loss.item()" in guarded and "grad_norm.item()" in guarded, new
    kit.load(new)["train"](steps=12, log=None)  # runs: the read is where its print is


@needs_nanogpt
def test_the_llama_workloads_log_line_keeps_its_read():
    from tests.kits.paths import WORKLOADS

    src = (WORKLOADS / "llama" / "train_llama.py").read_text()
    new, out = _apply("remove_host_sync", src, "npu", "train_llama.py")
    guarded = new.split("if step % _TB_LOG_EVERY == 0:")[1]
    assert "train_loss = loss.item()" in guarded.split("print(")[0], new
