"""compile_region and softcap_ce_fused.

Compiled regions are checked with Dynamo's eager backend and fullgraph=True (see
recipe_testkit.eager_compile): the region must trace as one graph and compute the same; the
Inductor code generation itself is torch's, and too slow for unit tests on 2 cores.
"""

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


def _apply(name, src, target, site=None, file="p.py"):
    out = kit.apply(name, src, target, site, file=file)
    assert isinstance(out, RewriteProposal), out
    return out.files[file], out


@needs_nanogpt
def test_compile_region_candidates_on_nanogpt():
    import tomllib

    from trainbridge.workload import Manifest

    man = Manifest.model_validate(tomllib.loads((kit.NANOGPT.parent / "trainbridge.toml").read_text()))
    sites = {s.qualname for s in RECIPES["compile_region"].find({"train_gpt.py": NANO}, "cpu", protected=man.protected)}
    assert {"zeropower_via_newtonschulz5", "norm", "apply_rotary_emb", "MLP.forward"} <= sites
    # not regions: the loop, the optimizer step, schedules, builders, the model-wide forward, protected code
    assert not sites & {"main", "Muon.step", "lr_multiplier", "build_optimizers", "GPT.forward", "parse_overrides",
                        "distributed_data_generator", "_load_data_shard"}


@needs_nanogpt
@pytest.mark.parametrize("site", ["zeropower_via_newtonschulz5", "norm"])
def test_compile_region_wraps_exactly_one_function_and_traces_whole(site):
    new, out = _apply("compile_region", NANO, "cpu", site, "train_gpt.py")
    assert new.count("@torch.compile(dynamic=False)") == 1
    assert new.index("@torch.compile(dynamic=False)") < new.index(f"def {site}(") < \
        new.index("@torch.compile(dynamic=False)") + 80
    a = kit.load(NANO)
    with kit.eager_compile():
        b = kit.load(new)
        x = torch.randn(24, 16)
        ya, yb = a[site](x), b[site](x)
    tol = dict(atol=1e-2, rtol=1e-2) if site.startswith("zeropower") else dict(atol=1e-6, rtol=1e-5)  # bf16 inside
    torch.testing.assert_close(yb.float(), ya.float(), **tol)


def test_compile_region_needs_one_named_region_and_uses_the_npu_backend():
    r = RECIPES["compile_region"]
    out = r.apply({"p.py": IDIOMS}, "cpu")
    assert isinstance(out, NotApplicable) and "exactly one" in out.reason
    out = r.apply({"p.py": IDIOMS}, "cpu", "train")
    assert isinstance(out, NotApplicable) and "not a compile candidate" in out.reason
    new, _ = _apply("compile_region", IDIOMS, "npu", "rope")
    assert '@torch.compile(backend="npu", dynamic=False)\ndef rope(' in new and "import torch_npu" in new
    out = r.apply({"p.py": IDIOMS}, "cpu", ["rope", "FFN.forward"])
    assert isinstance(out, NotApplicable)


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


def test_compile_sites_a_step_never_calls_are_not_planned(tmp_path):
    """`shrink` runs once before training: compiling it cannot make a step faster, so the
    planner drops it from the compile candidates, on the step's recorded function calls."""
    from trainbridge.agent.nodes import _run_in_step
    from trainbridge.harness.runner import run_workload
    from trainbridge.profile.analysis import analyse
    from trainbridge.workload import load_workload

    wl = load_workload(Path(__file__).parent / "fixtures" / "harness" / "tiny")
    files = {"train.py": (wl.root / "train.py").read_text()}
    sites = RECIPES["compile_region"].find(files, "cpu")
    assert {"shrink", "Net.forward"} <= {s.qualname for s in sites}
    run = run_workload(wl, "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=2, profile_steps=1,
                       count_ops=True)
    assert run.status == "ok", run.error
    kept = {s.qualname for s in _run_in_step(sites, analyse(run, "tiny"))}
    assert "Net.forward" in kept and "shrink" not in kept
