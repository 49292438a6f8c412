"""threads_knob on the cpu target: torch.set_num_threads(physical cores), placed after the imports.

(Its npu form, the TASK_QUEUE_ENABLE / CPU_AFFINITY_CONF environment knobs, is tested with
npu_alloc_conf's in test_recipe_framework.py.)"""

from trainbridge.agent.rewriters import recipes_runtime
from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable

from tests.kits import recipe_testkit as kit
from tests.kits.recipe_testkit import applied as _apply

MINI = kit.MINIGPT.read_text()


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
