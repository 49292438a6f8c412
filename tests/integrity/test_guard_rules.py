"""Each guard rule, tried with the attack it refuses, and legitimate recipe outputs that pass.

Attacks are edits of the cpu port of the minigpt fixture (manifest: get_batch protected;
batch_size, seq_len, num_steps, seed, vocab protected names) and of nanogpt (Hyperparameters,
parse_overrides, data loading protected).
"""

import tomllib

import pytest

from trainbridge.agent.guard import RULES, check_candidate
from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable
from trainbridge.targets.port_source import port_program
from trainbridge.workload import Manifest

from tests.kits import recipe_testkit as kit

MINI_DIR = kit.MINIGPT.parent
MINI_MAN = Manifest.model_validate(tomllib.loads((MINI_DIR / "trainbridge.toml").read_text()))
MINI = port_program({"train.py": kit.MINIGPT.read_text()}, "cpu").files
NANO = kit.nanogpt_source()
needs_nanogpt = pytest.mark.skipif(NANO is None, reason="workloads/nanogpt/train_gpt.py not present")


def _check(cand, original=MINI, man=MINI_MAN, target="cpu"):
    return check_candidate(original, cand, man.protected, man.editable, target)


def _edit(old, new, src=None, file="train.py"):
    text = (src or MINI)[file] if isinstance(src or MINI, dict) else src
    assert old in text, old
    return {file: text.replace(old, new, 1)}


def _rules(verdict, severity="error"):
    return {v.rule for v in verdict.violations if v.severity == severity}


def test_every_rule_has_a_rationale():
    assert all(r.rationale and r.severity in ("error", "warning") for r in RULES.values())


def test_unchanged_program_passes():
    v = _check(dict(MINI))
    assert v.passed and not v.violations


ATTACKS = {
    # rule: (old, new)
    "protected_symbol": ("torch.randint(1, 4,", "torch.randint(1, 2,"),  # inside get_batch
    "protected_name": ("def main():\n", "batch_size = 4\n\n\ndef main():\n"),
    "seed": ("def main():\n    torch.manual_seed(seed)\n", "def main():\n    torch.manual_seed(seed + 1)\n"),
    "silent_fallback": ("        probs = F.softmax(scores, dim=-1)\n",
                        "        try:\n            probs = torch.special.softmax(scores, dim=-1)\n"
                        "        except Exception:\n            probs = F.softmax(scores, dim=-1)\n"),
    "early_return": ("        h = h + self.attn(self.n1(h))\n", "        h = h + self.attn(self.n1(h))\n        return h\n"),
    "layer_skip": ("for layer in self.layers:", "for layer in self.layers[:1]:"),
    "monkeypatch": ("import torch\n", "import torch\nimport time\ntime.perf_counter = lambda: 0.0\n"),
    "process_control": ("        loss.backward()\n", "        loss.backward()\n        if step == 3:\n            sys.exit(0)\n"),
    "loss_removed": ("F.cross_entropy(logits.view(-1, vocab), targets.reshape(-1))", "logits.float().mean()"),
    "grad_disabled": ("            h = layer(h)\n", "            with torch.no_grad():\n                h = layer(h)\n"),
    "step_loop": ("        opt.step()\n", "        opt.step()\n        if step > 5:\n            break\n"),
    "work_removed": ("        opt.step()\n", "        pass\n"),
    "argv": ("def main():\n", "def main():\n    sys.argv.append('x')\n"),
    "side_stream": ("        loss.backward()\n", "        with torch.cuda.stream(torch.cuda.Stream()):\n            loss.backward()\n"),
    "harness_env": ("import sys\n", "import sys\nimport os\nos.environ['PYTHONHASHSEED'] = '0'\n"),
    "default_dtype": ("def main():\n", "def main():\n    torch.set_default_dtype(torch.float16)\n"),
    "target_api": ("import torch\n", "import torch\nimport torch_npu\n"),
    "backward_added": ("        loss.backward()\n", "        loss.backward()\n        (loss * 0).backward()\n"),
    "reflection": ("def main():\n", "def main():\n    exec('import time; time.perf_counter = lambda: 0.0')\n"),
}


@pytest.mark.parametrize("rule", ATTACKS)
def test_attack_is_refused_by_its_rule(rule):
    old, new = ATTACKS[rule]
    v = _check(_edit(old, new))
    assert not v.passed and rule in _rules(v), v.violations
    assert all(x.file == "train.py" for x in v.violations)


def test_more_monkeypatching_spellings():
    for old, new in [("import torch\n", "import torch\ntorch.cuda.synchronize = lambda: None\n"),
                     ("import torch\n", "import torch\ntorch.Tensor.backward = lambda self, *a, **k: None\n"),
                     ("import torch\n", "import torch\nfrom time import perf_counter\nperf_counter = lambda: 0.0\n"),
                     ("import torch\n", "import torch\nsetattr(torch, 'compile', lambda f, **k: f)\n"),
                     ("import torch.nn.functional as F\n", "import torch.nn.functional as F\nF.cross_entropy = lambda *a, **k: 0\n")]:
        v = _check(_edit(old, new))
        assert "monkeypatch" in _rules(v), (new, v.violations)
    # settings are knobs, not patches
    v = _check(_edit("import torch\n", "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n"))
    assert v.passed


@pytest.mark.parametrize("new", [
    "t = time\nt.perf_counter = lambda: 0.0\n",                           # a patch through a plain alias
    "__import__('time').perf_counter = lambda: 0.0\n",                     # through __import__
    "eval('1')\n",
    "clock = sys.modules['trainbridge.harness.clock']\n",                  # the harness through sys.modules
    "import gc\nclocks = [o for o in gc.get_objects() if type(o).__name__ == 'StepClock']\n",
    "import importlib\nh = importlib.import_module('trainbridge.harness.clock')\n",
    "frame = sys._getframe(1).f_back\n",
    "import ctypes\n",
    "import os\nos.system('true')\n",
    "import socket\n",
])
def test_spellings_that_reach_the_clock_or_the_interpreter_are_refused(new):
    v = _check(_edit("def get_batch(gen):", "import time\n" + new + "\n\ndef get_batch(gen):"))
    assert not v.passed and _rules(v) & {"reflection", "monkeypatch"}, (new, v.violations)


def test_reflection_the_original_already_had_is_not_a_change():
    """A configurator run through exec (a common form of real programs) stays allowed as it was."""
    original = _edit("def main():\n", "def main():\n    exec('x = 1')\n")
    candidate = {"train.py": original["train.py"].replace("(hidden * hidden).mean(dim=-1, keepdim=True)",
                                                          "hidden.pow(2).mean(-1, keepdim=True)")}
    assert candidate != original
    v = _check(candidate, original=original)
    assert v.passed, v.violations

def test_more_process_control_spellings():
    for new in ("import threading\nthreading.Thread(target=print).start()\n", "import os\nos._exit(0)\n",
                "raise SystemExit(0)\n", "from concurrent.futures import ThreadPoolExecutor\n"):
        v = _check(_edit("def get_batch(gen):", new + "\n\ndef get_batch(gen):"))
        assert "process_control" in _rules(v), (new, v.violations)


def test_fallback_variants():
    v = _check(_edit("        probs = F.softmax(scores, dim=-1)\n",
                     "        with contextlib.suppress(Exception):\n            probs = F.softmax(scores, dim=-1)\n"))
    assert "silent_fallback" in _rules(v)
    # a handler that only re-raises falls back to nothing
    v = _check(_edit("        probs = F.softmax(scores, dim=-1)\n",
                     "        try:\n            probs = F.softmax(scores, dim=-1)\n        except Exception:\n            raise\n"))
    assert "silent_fallback" not in _rules(v)


def test_loss_definition_must_keep_its_arguments_but_fused_equivalents_pass():
    v = _check(_edit("targets.reshape(-1))", "targets.reshape(-1), label_smoothing=0.1)"))
    assert "loss_removed" in _rules(v)
    v = _check(_edit("targets.reshape(-1))", "targets.reshape(-1), reduction='sum')"))
    assert "loss_removed" in _rules(v)
    fused = _edit("F.cross_entropy(logits.view(-1, vocab), targets.reshape(-1))",
                  "torch_npu.npu_cross_entropy_loss(logits.view(-1, vocab), targets.reshape(-1))[0].reshape(())")
    fused["train.py"] = fused["train.py"].replace("import torch\n", "import torch\nimport torch_npu\n", 1)
    v = _check(fused, target="npu")
    assert "loss_removed" not in _rules(v) and v.passed, v.violations
    # moving the loss into a helper the forward calls still computes it
    helper = _edit("        return F.cross_entropy(logits.view(-1, vocab), targets.reshape(-1))",
                   "        return _loss(logits, targets)")
    helper["train.py"] += "\n\ndef _loss(logits, targets):\n    return F.cross_entropy(logits.view(-1, vocab), targets.reshape(-1))\n"
    assert _check(helper).passed


def test_files_the_manifest_does_not_let_an_agent_edit():
    v = _check({**MINI, "trainbridge.toml": "name = 'x'\n"})
    assert not v.passed and "not_editable" in _rules(v)
    v = _check({**MINI, "helper.py": "x = 1\n"})
    assert not v.passed and "not_editable" in _rules(v)
    v = _check({"train.py": "def broken(:\n"})
    assert not v.passed and "parse" in _rules(v)


def test_protected_symbol_formatting_only_is_a_warning():
    v = _check(_edit("def get_batch(gen):\n", "def get_batch(gen):  # the data\n"))
    assert v.passed and "protected_symbol_format" in _rules(v, "warning")
    v = _check(_edit("def get_batch(gen):", "def get_batch(gen):\n    return None\n\n\ndef get_batch(gen):"))
    assert not v.passed and "protected_symbol" in _rules(v)  # defined twice: the later one shadows


@needs_nanogpt
def test_nanogpt_workload_attacks():
    man = Manifest.model_validate(tomllib.loads((kit.NANOGPT.parent / "trainbridge.toml").read_text()))
    port = port_program({"train_gpt.py": NANO}, "cpu").files

    def check(old, new):
        cand = _edit(old, new, port, "train_gpt.py")
        return check_candidate(port, cand, man.protected, man.editable, "cpu")

    v = check("    train_loader = distributed_data_generator(args.train_files, args.batch_size,",
              "    train_loader = distributed_data_generator(args.train_files, args.batch_size // 2,")
    assert "protected_call" in _rules(v)
    v = check("    # ---- data\n", "    # ---- data\n    args.batch_size = 2\n")
    assert "protected_field" in _rules(v)
    v = check("    # ---- data\n", "    # ---- data\n    setattr(args, 'seq_len', 64)\n")
    assert "protected_field" in _rules(v)
    v = check("def main(", "def _helper():\n    return 1\n\n\ndef main(")
    assert v.passed  # new code elsewhere is fine


def _recipe_outputs(files, target, protected):
    (file, src), = files.items()
    for name, r in RECIPES.items():
        sites = r.find(files, target, protected=protected)
        specs = [s.qualname for s in sites] if r.per_site else [None]
        for spec in specs[:2]:
            out = kit.apply(name, src, target, spec, file=file, protected=protected)
            if not isinstance(out, NotApplicable):
                yield name, out


@pytest.mark.parametrize("target", ["cpu", "npu"])
def test_legitimate_recipe_outputs_pass_on_minigpt(target):
    files = port_program({"train.py": kit.MINIGPT.read_text()}, target).files
    seen = 0
    for name, out in _recipe_outputs(files, target, MINI_MAN.protected):
        v = check_candidate(files, out.files, MINI_MAN.protected, MINI_MAN.editable, target)
        assert v.passed, (name, v.violations)
        seen += 1
    assert seen >= 5


@needs_nanogpt
@pytest.mark.parametrize("target", ["cpu", "npu"])
def test_legitimate_recipe_outputs_pass_on_nanogpt(target):
    man = Manifest.model_validate(tomllib.loads((kit.NANOGPT.parent / "trainbridge.toml").read_text()))
    files = port_program({"train_gpt.py": NANO}, target).files
    names = set()
    for name, out in _recipe_outputs(files, target, man.protected):
        v = check_candidate(files, out.files, man.protected, man.editable, target)
        assert v.passed, (name, v.violations)
        names.add(name)
    assert {"rms_norm_fused", "rotary_fused", "sdpa_attention", "relu2_fused", "fused_optimizer",
            "compile_region", "softcap_ce_fused"} <= names
