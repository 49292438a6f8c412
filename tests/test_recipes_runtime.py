"""L0 recipes: threads_knob, the npu env/statement knobs and autocast_reapply."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "programs"))
import recipe_testkit as kit  # noqa: E402

from trainbridge.agent.rewriters import recipes_runtime  # noqa: E402
from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable, RewriteProposal, recipes_for  # noqa: E402

IDIOMS = kit.read("idioms_gpt.py")
MINI = kit.MINIGPT.read_text()
NANO = kit.nanogpt_source()


def _apply(name, src, target, file="p.py"):
    out = kit.apply(name, src, target, file=file)
    assert isinstance(out, RewriteProposal), out
    return out.files[file], out


def test_registry_shape():
    for r in RECIPES.values():
        assert r.mechanism and r.targets and r.level.startswith("L")
    assert [r.name for r in recipes_for("precision", "npu")] == ["npu_hf32", "autocast_reapply"]
    assert RECIPES["rotary_fused"].level_for("cpu") == "L3" and RECIPES["rotary_fused"].level_for("npu") == "L2"
    assert RECIPES["compile_region"].per_site


def test_threads_knob_sets_physical_cores_after_imports(monkeypatch):
    monkeypatch.setattr(recipes_runtime, "physical_cores", lambda: 3)
    monkeypatch.setattr(recipes_runtime, "default_threads", lambda: 8)
    new, out = _apply("threads_knob", MINI, "cpu", "train.py")
    assert out.sites[0].file == "train.py"
    line = "torch.set_num_threads(3)"
    assert line in new and new.index(line) > new.index("import torch.nn.functional as F")
    # nothing to change when the default already equals the physical cores
    monkeypatch.setattr(recipes_runtime, "default_threads", lambda: 3)
    out = RECIPES["threads_knob"].apply({"train.py": MINI}, "cpu")
    assert isinstance(out, NotApplicable) and "already" in out.reason
    assert isinstance(RECIPES["threads_knob"].apply({"train.py": new}, "cpu"), NotApplicable)  # program sets it
    assert recipes_runtime.physical_cores() >= 1


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


def test_autocast_reapply_restores_bf16_on_cpu():
    new, out = _apply("autocast_reapply", IDIOMS, "cpu")
    assert 'torch.autocast(device_type="cpu", dtype=torch.bfloat16)' in new and out.sites[0].detail["from"] == "cuda"
    prog = ("import torch\nlin = torch.nn.Linear(8, 8)\nx = torch.randn(2, 8)\n"
            "with torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n    y = lin(x)\n")
    new, _ = _apply("autocast_reapply", prog, "cpu")
    with pytest.warns(UserWarning, match="Disabling autocast"):
        assert kit.load(prog)["y"].dtype == torch.float32  # the port's no-op autocast
    assert kit.load(new)["y"].dtype == torch.bfloat16  # the GPU's precision, on the target


def test_autocast_variants():
    old_api = "import torch\nwith torch.cuda.amp.autocast():\n    pass\n"
    new, out = _apply("autocast_reapply", old_api, "cpu")
    assert 'torch.autocast(device_type="cpu", dtype=torch.bfloat16)' in new
    fp16 = "import torch\nwith torch.amp.autocast('cuda', dtype=torch.float16):\n    pass\n"
    new, out = _apply("autocast_reapply", fp16, "cpu")
    assert "torch.amp.autocast('cpu', dtype=torch.bfloat16)" in new and any("bfloat16" in n for n in out.notes)
    new, _ = _apply("autocast_reapply", fp16, "npu")
    assert "torch.amp.autocast('npu', dtype=torch.float16)" in new
    for src in ("import torch\nwith torch.autocast(device_type='cuda', enabled=False):\n    pass\n",
                "import torch\nx = 1\n"):
        out = RECIPES["autocast_reapply"].apply({"p.py": src}, "cpu")
        assert isinstance(out, NotApplicable) and "out of scope" in out.reason
    assert isinstance(RECIPES["autocast_reapply"].apply({"p.py": IDIOMS}, "cuda"), NotApplicable)


@pytest.mark.skipif(NANO is None, reason="workloads/nanogpt/train_gpt.py not present")
def test_autocast_on_the_cpu_port_of_nanogpt():
    from trainbridge.targets.port_source import port_program

    port = port_program({"train_gpt.py": NANO}, "cpu")
    lost = [c for c in port.changes if c.kind == "precision_lost"]
    new, out = _apply("autocast_reapply", port.files["train_gpt.py"], "cpu", "train_gpt.py")
    assert len(out.sites) == len(lost) >= 1 and 'device_type="cuda"' not in new


def test_knob_recipes_never_touch_files_the_manifest_does_not_let_an_agent_edit():
    """nanogpt's data/make_shards.py also has `if __name__ == "__main__"`: a knob placed there
    is a guard rejection, so the planner must not find a site there in the first place."""
    from trainbridge.agent.rewriters.recipe_base import NotApplicable, off_limits
    from trainbridge.agent.rewriters.recipes import RECIPES
    from trainbridge.harness.runner import port_sources
    from trainbridge.workload import load_workload

    wl = load_workload(Path(__file__).resolve().parents[1] / "workloads" / "nanogpt")
    files, _ = port_sources(wl, "npu")
    assert "data/make_shards.py" in files
    fence = off_limits(files, wl.manifest.protected, wl.manifest.editable)
    for name in ("npu_hf32", "npu_alloc_conf"):
        assert "data/make_shards.py" in {s.file for s in RECIPES[name].find(files, "npu")}, "the trap is real"
        assert all(s.file == "train_gpt.py" for s in RECIPES[name].find(files, "npu", protected=fence))
        out = RECIPES[name].apply(files, "npu", protected=fence)
        assert isinstance(out, NotApplicable) or out.changed_files == ["train_gpt.py"], name
