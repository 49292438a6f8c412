"""InductorCapturePlugin inside the harness: an unmodified program, run in the child.

- the harness's tiny program with gradient accumulation (two forwards per step, SGD + Adam):
  the step boundaries the plugin infers and the launch counts per step;
- workloads/nanogpt end to end (`collect_workload`, device cuda -> fake-CUDA Triton kernels),
  under the 3-minute budget on 2 cores.
"""

import time

import pytest

from trainbridge.evidence import build_bundle, collect_workload
from trainbridge.harness.runner import run_workload
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES, ROOT
from tests.kits.small_workloads import small_nanogpt

TINY = FIXTURES / "harness" / "tiny"
NANOGPT = ROOT / "workloads" / "nanogpt"
PLUGIN = "trainbridge.evidence.capture:InductorCapturePlugin"


@pytest.mark.slow
def test_plugin_counts_launches_per_step_with_gradient_accumulation(tmp_path):
    wl = load_workload(TINY)
    wl = wl.model_copy(update={"manifest": wl.manifest.model_copy(update={"args": ["accumulate"]})})
    raw_path = tmp_path / "raw.json"
    r = run_workload(wl, "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=2, plugins=[PLUGIN],
                     plugin_options={"device": "cpu", "out": str(raw_path)})
    assert r.status == "ok", r.error
    assert r.plugin_outputs == {"evidence": str(raw_path)}
    b = build_bundle(raw_path, source_root=TINY, workload_name="tiny")
    assert b.route == "cpu_inductor"
    by = {(g.phase, g.region): g for g in b.graphs}
    assert by[("forward", "model")].calls_per_step == 2 and by[("backward", "model")].calls_per_step == 2
    assert by[("optimizer", "optimizer:SGD")].calls_per_step == 1
    assert by[("optimizer", "optimizer:Adam")].calls_per_step == 1
    assert b.compiled_launches_per_step == sum(g.launches_per_call * g.calls_per_step for g in b.graphs)
    assert b.eager_ops_per_step and b.eager.by_phase.get("backward", 0) > 0
    assert b.eager.by_phase.get("optimizer:Adam", 0) > 0
    assert {i.pattern for i in b.intents} >= {"cross_entropy", "optimizer_update"}
    assert not any(e.startswith("error") for e in b.limitations), b.limitations


@pytest.mark.slow
def test_nanogpt_end_to_end(tmp_path):
    src = (NANOGPT / "train_gpt.py").read_text().splitlines()

    def line_of(text):
        return next(i + 1 for i, l in enumerate(src) if text in l)

    def covers(intent, text):
        ln = line_of(text)
        return any(s.file == "train_gpt.py" and s.start_line <= ln <= s.end_line for s in intent.spans)

    def one(pattern):
        found = b.intents_for(pattern)
        assert found, [i.id for i in b.intents]
        return max(found, key=lambda i: i.confidence)

    t0 = time.perf_counter()
    # the tiny configuration: the same source lines, a smaller model to compile
    b = collect_workload(load_workload(small_nanogpt(tmp_path / "w")), device="cuda", out_dir=tmp_path)
    seconds = time.perf_counter() - t0
    assert seconds < 180, f"collection took {seconds:.0f} s"
    assert b.route in ("fake_cuda_codegen", "real_gpu") and b.workload == "nanogpt"
    assert len(b.program_sha) == 64
    assert all(k.backend == "triton" for k in b.kernels if not k.is_library)
    assert {g.phase for g in b.graphs} == {"forward", "backward", "optimizer"}
    assert {g.region for g in b.graphs if g.phase == "optimizer"} == {"optimizer:AdamW", "optimizer:Muon"}
    assert b.eager_ops_per_step > b.compiled_launches_per_step > 0 and b.fragmentation_ratio > 1
    assert covers(one("rms_norm"), "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)")
    assert covers(one("rotary"), "y1 = x1 * cos + x2 * sin")
    assert covers(one("attention"), "att.softmax(dim=-1)")
    assert covers(one("relu2"), "F.relu(x).square()")
    assert covers(one("softcap_cross_entropy"), "torch.tanh(logits / c)")
    assert {i.id for i in b.intents_for("optimizer_update")} >= {"optimizer_update@adamw", "optimizer_update@muon"}
    labels = [s.label for s in b.supernodes]
    assert "attention: qkv projection + QK-norm + rotary" in labels
    # porting: the GPU program's bf16 autocast and the per-step loss.item()
    prec = [i for i in b.intents_for("precision") if covers(i, "loss = model(x, y)")]
    assert prec and prec[0].level == "L0" and prec[0].gap_class == "precision"
    sync = [i for i in b.intents_for("host_sync") if covers(i, "train_loss = loss.item()")]
    assert sync and sync[0].grade == "A" and sync[0].eager_ops_removed >= 1
