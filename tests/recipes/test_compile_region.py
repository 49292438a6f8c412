"""compile_region: candidates, one named region per candidate, the npu backend, and sites a step
never calls dropped by the planner.

Compiled regions are checked with Dynamo's eager backend and fullgraph=True (see
recipe_testkit.eager_compile): the region must trace as one graph and compute the same; the
Inductor code generation itself is torch's, and too slow for unit tests on 2 cores.
"""

import textwrap

import pytest
import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable

from tests.kits import recipe_testkit as kit
from tests.kits.paths import FIXTURES
from tests.kits.recipe_testkit import applied_at as _apply
from tests.kits.recipe_testkit import needs_nanogpt

IDIOMS = kit.read("idioms_gpt.py")
NANO = kit.nanogpt_source()


def test_compile_region_wraps_exactly_one_function():
    src = textwrap.dedent("""
        import torch
        def zeropower_via_newtonschulz5(G):
            return G
        def rotary(x):
            return x
        def main():
            pass
    """)
    r = RECIPES["compile_region"]
    sites = [s.qualname for s in r.find({"p.py": src}, "cpu")]
    assert sites == ["zeropower_via_newtonschulz5", "rotary"]
    new = r.apply({"p.py": src}, "cpu", "rotary").files["p.py"]
    assert new.count("@torch.compile") == 1 and new.index("@torch.compile") < new.index("def rotary")


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


def test_compile_sites_a_step_never_calls_are_not_planned(tmp_path):
    """`shrink` runs once before training: compiling it cannot make a step faster, so the
    planner drops it from the compile candidates, on the step's recorded function calls."""
    from trainbridge.agent.nodes import _run_in_step
    from trainbridge.harness.runner import run_workload
    from trainbridge.profile.analysis import analyse
    from trainbridge.workload import load_workload

    wl = load_workload(FIXTURES / "harness" / "tiny")
    files = {"train.py": (wl.root / "train.py").read_text()}
    sites = RECIPES["compile_region"].find(files, "cpu")
    assert {"shrink", "Net.forward"} <= {s.qualname for s in sites}
    run = run_workload(wl, "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=2, profile_steps=1,
                       count_ops=True)
    assert run.status == "ok", run.error
    kept = {s.qualname for s in _run_in_step(sites, analyse(run, "tiny"))}
    assert "Net.forward" in kept and "shrink" not in kept
