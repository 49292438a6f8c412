"""Evidence on a second model with other idioms (tests/fixtures/evidence/tiny_mixer.py):
conv stem, LayerNorm written as a method, SiLU gating, GELU, plain cross-entropy, SGD;
plus the porting intents found in its GPU training loop (autocast, .item(), torch.compile)."""

import pytest
import torch

from trainbridge.evidence import collect_inprocess
from trainbridge.evidence.source_scan import scan_program

from tests.kits.paths import FIXTURES, import_fixture

FIX = FIXTURES / "evidence"
tiny_mixer = import_fixture("evidence/tiny_mixer.py")

SRC = (FIX / "tiny_mixer.py").read_text().splitlines()


def line_of(text: str) -> int:
    return next(i + 1 for i, l in enumerate(SRC) if text in l)


def covers(intent, text: str) -> bool:
    ln = line_of(text)
    return any(s.file == "tiny_mixer.py" and s.start_line <= ln <= s.end_line for s in intent.spans)


def one(bundle, pattern):
    found = bundle.intents_for(pattern)
    assert found, f"no {pattern} intent: {[i.id for i in bundle.intents]}"
    return max(found, key=lambda i: i.confidence)


@pytest.fixture(scope="module")
def bundle():
    torch.set_num_threads(2)
    model, opts, step = tiny_mixer.make()
    return collect_inprocess(model, opts, step, device="cuda", source_root=FIX, workload_name="tiny_mixer")


def test_method_style_layer_norm(bundle):
    ln = one(bundle, "layer_norm")
    assert ln.spans[0].function == "_norm"
    assert covers(ln, "var = (x - mu).pow(2).mean(-1, keepdim=True)")
    assert covers(ln, "return (x - mu) * torch.rsqrt(var + eps) * self.ln_w + self.ln_b")
    assert "layer_norm" in ln.targets["cpu"][0].api
    assert not bundle.intents_for("rms_norm")  # a mean-subtracting norm is not an RMSNorm


def test_silu_gating_and_gelu(bundle):
    sw = one(bundle, "swiglu")
    assert covers(sw, "x = x + self.down(F.silu(a) * b)")
    assert "npu_swiglu" in sw.targets["npu"][0].api
    gelu = one(bundle, "gelu")
    assert covers(gelu, "h = F.gelu(self.fc1(self._norm(x)))")
    assert any("MLP activation" in s.label and "SiLU" in s.label for s in bundle.supernodes)


def test_cross_entropy_conv_and_sgd(bundle):
    ce = one(bundle, "cross_entropy")
    assert covers(ce, "return F.cross_entropy(logits, labels)")
    assert not bundle.intents_for("softcap_cross_entropy")
    assert any(k.kind == "conv" for k in bundle.kernels_in("forward"))
    assert any(k.kind == "conv" for k in bundle.kernels_in("backward"))
    opt = one(bundle, "optimizer_update")
    assert opt.id == "optimizer_update@sgd" and "NpuFused" in opt.targets["npu"][0].api
    assert bundle.fragmentation_ratio and bundle.fragmentation_ratio > 1


def test_porting_intents_from_the_gpu_training_loop(bundle):
    prec = one(bundle, "precision")
    assert prec.gap_class == "precision" and prec.level == "L0" and prec.kind == "porting"
    assert covers(prec, 'with torch.autocast(device_type="cuda", dtype=torch.bfloat16):')
    assert "device_type='npu'" in prec.targets["npu"][0].api and "bfloat16" in prec.targets["npu"][0].api
    sync = one(bundle, "host_sync")
    assert sync.gap_class == "sync" and sync.level == "L1" and covers(sync, "print(f\"step {step} loss {loss.item()")
    comp = one(bundle, "compile_model")  # the program compiles its model whole, not one of its functions
    assert comp.gap_class == "compiler_boundary" and covers(comp, "model = torch.compile(model)")
    assert "backend='npu'" in comp.targets["npu"][0].api
    assert not bundle.intents_for("compile_region")


def test_compiling_one_of_the_programs_functions_is_a_region_and_an_object_is_the_model(tmp_path):
    (tmp_path / "p.py").write_text(
        "import torch\n\n\ndef newton_schulz(g):\n    return g @ g.T\n\n\n"
        "ns = torch.compile(newton_schulz)\n\n\n@torch.compile\ndef norm(x):\n    return x / x.norm()\n\n\n"
        "def main(model):\n    model = torch.compile(model, dynamic=False)\n    return model\n")
    found = {f.detail["target"]: f.detail for f in scan_program(tmp_path, ["p.py"]) if f.kind == "torch_compile"}
    assert found["newton_schulz"]["function"] is True and found["model"]["function"] is False
    assert found["norm"]["decorator"] is True


def test_scan_ignores_syncs_outside_the_step():
    findings = scan_program(FIX, ["tiny_mixer.py"])
    syncs = [f for f in findings if f.kind == "host_sync"]
    assert [f.line for f in syncs] == [line_of("print(f\"step {step} loss {loss.item()")]
    auto = next(f for f in findings if f.kind == "autocast")
    assert auto.in_step and auto.detail == {"device_type": "cuda", "dtype": "bfloat16"}


def test_a_capture_that_fused_the_whole_step_is_a_compile_model_intent():
    """The capture compiles the whole model: 2x fewer launches than eager ops or better makes an
    intent (0.7); a step that barely fused, or no model graph, makes none."""
    from trainbridge.evidence.intents import _Ctx, whole_model_intent

    ctx = _Ctx([], None, None)
    it = whole_model_intent(ctx, 2098, 842, {"model", "optimizer:AdamW"})
    assert it is not None and it.pattern == "compile_model" and it.confidence == 0.7
    assert "842 kernel launches a step where eager launches 2098" in it.summary
    assert it.eager_ops_removed == 2098 - 842 and "model.compile" in it.targets["cpu"][0].api
    assert whole_model_intent(ctx, 1500, 842, {"model"}) is None  # 1.8x: not enough fusion to say so
    assert whole_model_intent(ctx, 2098, 842, {"optimizer:AdamW"}) is None  # no model graph captured
    assert whole_model_intent(ctx, None, 842, {"model"}) is None  # no eager step profiled
