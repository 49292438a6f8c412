"""Evidence capture on a nanogpt-like 4-layer GPT (tests/fixtures/evidence/tiny_gpt.py).

One capture per route for the whole module: device="cuda" (Triton kernels; on this CPU-only
machine through fake-CUDA code generation) and device="cpu" (Inductor's C++ backend).
Lines are looked up by their text, so editing the fixture does not break the tests.
"""

from types import SimpleNamespace

import pytest
import torch

from trainbridge.evidence import EvidenceBundle, collect_inprocess, render_summary, write_schema

from tests.kits.paths import FIXTURES, import_fixture

FIX = FIXTURES / "evidence"
tiny_gpt = import_fixture("evidence/tiny_gpt.py")

SRC = (FIX / "tiny_gpt.py").read_text().splitlines()


def line_of(text: str, nth: int = 0) -> int:
    hits = [i + 1 for i, l in enumerate(SRC) if text in l]
    assert hits, text
    return hits[nth]


def covers(intent, text: str) -> bool:
    ln = line_of(text)
    return any(s.file == "tiny_gpt.py" and s.start_line <= ln <= s.end_line for s in intent.spans)


def one(bundle, pattern):
    found = bundle.intents_for(pattern)
    assert found, f"no {pattern} intent: {[i.id for i in bundle.intents]}"
    return max(found, key=lambda i: i.confidence)


@pytest.fixture(scope="module")
def cuda_run(tmp_path_factory):
    torch.set_num_threads(2)
    model, opts, step = tiny_gpt.make(n_layer=2)  # 2 layers: every pattern, half the compile time
    out = tmp_path_factory.mktemp("gpt_cuda")
    import torch._functorch.config as fc
    import torch._inductor.config as ic

    before = (ic.fx_graph_cache, ic.trace.provenance_tracking_level, ic.post_grad_custom_post_pass,
              fc.enable_autograd_cache, fc.force_non_lazy_backward_lowering, torch.cuda.is_available())
    bundle = collect_inprocess(model, opts, step, device="cuda", source_root=FIX, workload_name="tiny_gpt",
                               code_dir=out / "code", raw_out=out / "raw.json")
    after = (ic.fx_graph_cache, ic.trace.provenance_tracking_level, ic.post_grad_custom_post_pass,
             fc.enable_autograd_cache, fc.force_non_lazy_backward_lowering, torch.cuda.is_available())
    restored = (before == after, "forward" not in vars(model), all("step" not in vars(o) for o in opts))
    return SimpleNamespace(bundle=bundle, restored=restored, dir=out)


@pytest.fixture(scope="module")
def cuda_bundle(cuda_run):
    return cuda_run.bundle


@pytest.fixture(scope="module")
def cpu_bundle():
    model, opts, step = tiny_gpt.make(n_layer=1, muon=False)
    return collect_inprocess(model, opts, step, device="cpu", source_root=FIX, workload_name="tiny_gpt")


def test_cuda_route_produces_triton_kernels_for_all_three_graphs(cuda_bundle):
    b = cuda_bundle
    assert b.route == ("real_gpu" if torch.cuda.is_available() else "fake_cuda_codegen")
    assert b.device == "cuda"
    phases = [g.phase for g in b.graphs]
    assert phases.count("forward") == 1 and phases.count("backward") == 1 and phases.count("optimizer") == 2
    assert all(g.calls_per_step == 1 and g.codegen_error is None for g in b.graphs)
    generated = [k for k in b.kernels if not k.is_library]
    assert generated and all(k.backend == "triton" and k.name.startswith("triton_") for k in generated)
    kinds = {k.kind for k in b.kernels}
    assert {"pointwise", "persistent_reduction", "mm", "bmm"} <= kinds
    assert any("fake_cuda" in l or "real_gpu" in l for l in b.limitations)
    # each kernel maps to post-grad nodes and ATen ops
    assert all(k.post_grad_nodes and k.aten_ops for k in generated)


def test_eager_vs_compiled_counts(cuda_bundle):
    b = cuda_bundle
    assert b.eager_ops_per_step and b.eager_ops_per_step > b.compiled_launches_per_step > 0
    assert b.compiled_launches_per_step == sum(g.launches_per_call * g.calls_per_step for g in b.graphs)
    assert b.fragmentation_ratio == pytest.approx(b.eager_ops_per_step / b.compiled_launches_per_step, rel=0.01)
    assert b.eager.by_phase["backward"] > 0 and b.eager.by_phase["model"] > 0
    assert b.eager.by_phase["optimizer:AdamW"] > 0 and b.eager.by_phase["optimizer:Muon"] > 0


def test_rms_norm_rotary_attention_relu2_softcap_found_on_their_lines(cuda_bundle):
    b = cuda_bundle
    rms = one(b, "rms_norm")
    assert covers(rms, "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)") and rms.grade == "A"
    assert rms.spans[0].function == "norm"
    assert any("npu_rms_norm" in t.api for t in rms.targets["npu"])
    assert any("F.rms_norm" in t.api or "functional.rms_norm" in t.api for t in rms.targets["cpu"])
    rot = one(b, "rotary")
    assert covers(rot, "y1 = x1 * cos + x2 * sin") and covers(rot, "y2 = x1 * (-sin) + x2 * cos")
    assert rot.spans[0].function == "apply_rotary_emb" and "npu_rotary_mul" in rot.targets["npu"][0].api
    att = one(b, "attention")
    assert covers(att, 'att = att.masked_fill(self.causal_mask[:T, :T], float("-inf"))')
    assert covers(att, "att = att.softmax(dim=-1)")
    assert "npu_fusion_attention" in att.targets["npu"][0].api
    assert "scaled_dot_product_attention" in att.targets["cpu"][0].api
    relu2 = one(b, "relu2")
    assert covers(relu2, "x = F.relu(x).square()")
    cap = one(b, "softcap_cross_entropy")
    assert covers(cap, "torch.tanh(logits / self.softcap)") and covers(cap, "F.cross_entropy(")
    for i in (rms, rot, att, relu2, cap):
        assert i.gap_class == "fusion" and i.kind == "compiler" and 0 < i.confidence <= 1
        assert i.evidence.kernels and all(k.startswith("triton_") for k in i.evidence.kernels)
        assert i.evidence.aten_ops and i.eager_ops_removed >= 0 and i.eager_ops


def test_optimizer_updates(cuda_bundle):
    b = cuda_bundle
    ids = {i.id: i for i in b.intents_for("optimizer_update")}
    assert "optimizer_update@adamw" in ids and "optimizer_update@muon" in ids
    muon = ids["optimizer_update@muon"]
    assert covers(muon, "A = X @ X.T") and covers(muon, "buf.lerp_(p.grad, 1 - group[\"momentum\"])")
    assert "torch.compile" in muon.targets["npu"][0].api  # custom optimizer: compile its math
    assert "NpuFusedAdamW" in ids["optimizer_update@adamw"].targets["npu"][0].api
    assert ids["optimizer_update@adamw"].eager_ops_removed > 0
    # Newton-Schulz runs in bf16: the capture sees it
    assert any(m.phase == "optimizer" and "bfloat16" in m.input_dtypes for m in b.matmul_dtypes)
    assert any(m.phase == "forward" and m.op == "mm" and m.input_dtypes == ["float32", "float32"]
               for m in b.matmul_dtypes)


def test_supernodes_cluster_by_meaning_and_region(cuda_bundle):
    labels = [s.label for s in cuda_bundle.supernodes]
    assert "attention: qkv projection + QK-norm + rotary" in labels
    assert any(l.startswith("softcap + cross-entropy") for l in labels)
    assert any(l.startswith("attention: scores + mask + softmax") for l in labels)
    assert any(l.startswith("MLP activation: ReLU²") for l in labels)
    assert any(l.startswith("optimizer update: Muon") for l in labels)
    qkv = next(s for s in cuda_bundle.supernodes if s.family == "attention_input")
    assert {"forward", "backward"} <= set(qkv.phases)
    assert qkv.library_launches_per_step > 0  # the q/k/v projections joined it
    # every kernel belongs to exactly one supernode
    ids = [k for s in cuda_bundle.supernodes for k in s.kernel_ids]
    assert len(ids) == len(set(ids)) == len(cuda_bundle.kernels)


def test_backward_kernels_point_at_the_forward_lines_they_differentiate(cuda_bundle):
    bwd = [k for k in cuda_bundle.kernels_in("backward") if not k.is_library]
    assert bwd and all(k.differentiates for k in bwd)
    norm_line = line_of("return x * torch.rsqrt(")
    assert any(s.line == norm_line for k in bwd for s in k.sources)
    assert any("rotary" in k.patterns for k in bwd) and any("relu2" in k.patterns for k in bwd)


def test_configs_and_wrappers_restored_and_code_kept(cuda_run):
    same_config, forward_restored, step_restored = cuda_run.restored
    assert same_config and forward_restored and step_restored
    files = sorted((cuda_run.dir / "code").glob("graph_*.py"))
    assert len(files) == 4 and "@triton.jit" in files[0].read_text()
    assert (cuda_run.dir / "raw.json").stat().st_size > 0


def test_bundle_roundtrip_schema_and_summary(cuda_bundle, tmp_path):
    p = cuda_bundle.save(tmp_path / "evidence.json")
    again = EvidenceBundle.load(p)
    assert again.model_dump() == cuda_bundle.model_dump()
    schema = write_schema(tmp_path / "schema.json")
    assert "EvidenceBundle" in schema.read_text() and "intents" in EvidenceBundle.json_schema()["properties"]
    from rich.console import Console

    console = Console(record=True, width=200)
    render_summary(cuda_bundle, console)
    text = console.export_text()
    assert "supernodes" in text and "rms_norm@tiny_gpt.py" in text and "fragmentation" in text


def test_cpu_route_uses_cpp_kernels(cpu_bundle):
    b = cpu_bundle
    assert b.route == "cpu_inductor" and b.device == "cpu"
    gen = [k for k in b.kernels if not k.is_library]
    assert gen and all(k.backend == "cpp" and k.name.startswith("cpp_fused_") for k in gen)
    assert covers(one(b, "rms_norm"), "return x * torch.rsqrt(")
    assert covers(one(b, "rotary"), "y1 = x1 * cos + x2 * sin")
    assert b.intents_for("optimizer_update")
