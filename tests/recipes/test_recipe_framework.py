"""The recipe registry, and tests that cover several recipes at once.

- the registry's shape (levels, targets, per-site recipes, recipes_for);
- the npu knob recipes together: threads_knob's npu environment knobs and npu_alloc_conf go
  before `import torch`; npu_jit_compile_off and npu_hf32 run against trainbridge.npu_reference;
  none of the four applies on cuda;
- knob recipes never place a site in a file the manifest does not let an agent edit (off_limits);
- rms_norm_fused and rotary_fused on nanogpt's whole model.
"""

import pytest
import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable, recipes_for

from tests.kits import recipe_testkit as kit
from tests.kits.paths import WORKLOADS
from tests.kits.recipe_testkit import applied as _apply
from tests.kits.recipe_testkit import needs_nanogpt

IDIOMS = kit.read("idioms_gpt.py")
NANO = kit.nanogpt_source()


def test_registry_shape():
    for r in RECIPES.values():
        assert r.mechanism and r.targets and r.level.startswith("L")
    assert [r.name for r in recipes_for("precision", "npu")] == ["npu_hf32", "autocast_reapply"]
    assert RECIPES["rotary_fused"].level_for("cpu") == "L3" and RECIPES["rotary_fused"].level_for("npu") == "L2"
    assert RECIPES["compile_region"].per_site


def test_npu_env_knobs_go_before_import_torch():
    new, _ = _apply("threads_knob", IDIOMS, "npu")
    first_torch = new.index("import torch")
    for var in ('"TASK_QUEUE_ENABLE", "2"', '"CPU_AFFINITY_CONF", "1"'):
        assert new.index(f"os.environ.setdefault({var})") < first_torch
    assert new.index("import os") < new.index("os.environ.setdefault")
    new, _ = _apply("npu_alloc_conf", IDIOMS, "npu")
    assert new.index('"PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True"') < new.index("import torch")
    for name in ("threads_knob", "npu_alloc_conf", "npu_jit_compile_off", "npu_hf32"):
        assert isinstance(RECIPES[name].apply({"p.py": IDIOMS}, "cuda"), NotApplicable)


@pytest.mark.skipif(not kit.has_reference(), reason="no trainbridge.npu_reference")
def test_npu_statement_knobs_run_against_the_reference_module():
    src = "import torch\n\n\ndef f():\n    return 1\n\n\nif __name__ == '__main__':\n    f()\n"
    jit, _ = _apply("npu_jit_compile_off", src, "npu")
    hf32, _ = _apply("npu_hf32", src, "npu")
    assert "import torch_npu" in jit and "set_compile_mode(jit_compile=False)" in jit
    assert jit.index("import torch_npu") < jit.index("set_compile_mode")
    with kit.fake_npu("reference"):
        kit.load(jit)
        kit.load(hf32)
        assert torch.npu.matmul.allow_hf32 is True


def test_knob_recipes_never_touch_files_the_manifest_does_not_let_an_agent_edit():
    """nanogpt's data/make_shards.py also has `if __name__ == "__main__"`: a knob placed there
    is a guard rejection, so the planner must not find a site there in the first place."""
    from trainbridge.agent.rewriters.recipe_base import NotApplicable, off_limits
    from trainbridge.agent.rewriters.recipes import RECIPES
    from trainbridge.harness.runner import port_sources
    from trainbridge.workload import load_workload

    wl = load_workload(WORKLOADS / "nanogpt")
    files, _ = port_sources(wl, "npu")
    assert "data/make_shards.py" in files
    fence = off_limits(files, wl.manifest.protected, wl.manifest.editable)
    for name in ("npu_hf32", "npu_alloc_conf"):
        assert "data/make_shards.py" in {s.file for s in RECIPES[name].find(files, "npu")}, "the trap is real"
        assert all(s.file == "train_gpt.py" for s in RECIPES[name].find(files, "npu", protected=fence))
        out = RECIPES[name].apply(files, "npu", protected=fence)
        assert isinstance(out, NotApplicable) or out.changed_files == ["train_gpt.py"], name


@needs_nanogpt
@pytest.mark.parametrize("target", ["cpu", "npu"])
def test_rotary_and_norm_on_nanogpt_whole_model(target):
    for name in ("rms_norm_fused", "rotary_fused"):
        new, out = _apply(name, NANO, target, "train_gpt.py")
        assert out.sites
        npu = "standin" if target == "npu" else None
        la, ga = kit.nanogpt_loss_and_grads(NANO)
        lb, gb = kit.nanogpt_loss_and_grads(new, npu=npu)
        kit.assert_close_and_aligned([la, *ga], [lb, *gb], atol=2e-5, rtol=2e-4)
