"""Importing real-GPU Inductor output: a TORCH_COMPILE_DEBUG folder, output_code.py, a log.

The fixture (tests/fixtures/evidence/debug_run, output_code.log) was generated with
make_debug_fixture.py by the fake-CUDA route and laid out like a GPU machine's debug folder
whose checkout was /gpu_box/modded/ (paths that do not exist here)."""


import pytest

from trainbridge.evidence import import_debug_output
from trainbridge.evidence.codeparse import parse_output_code
from trainbridge.evidence.frames import SourceFilter
from trainbridge.evidence.importer import parse_ir_post_fusion, split_output_code_log

from tests.kits.paths import FIXTURES

FIX = FIXTURES / "evidence"
DEBUG = FIX / "debug_run"
GRAPHS = next(DEBUG.rglob("torchinductor"))
SRC = (FIX / "tiny_gpt.py").read_text().splitlines()


def line_of(text: str) -> int:
    return next(i + 1 for i, l in enumerate(SRC) if text in l)


def covers(intent, text: str) -> bool:
    ln = line_of(text)
    return any(s.file == "tiny_gpt.py" and s.start_line <= ln <= s.end_line for s in intent.spans)


@pytest.fixture(scope="module")
def bundle():
    return import_debug_output(DEBUG, source_root=FIX, workload_name="tiny_gpt")


def test_fixture_is_small():
    size = sum(p.stat().st_size for p in DEBUG.rglob("*") if p.is_file()) + (FIX / "output_code.log").stat().st_size
    assert size < 200_000


def test_debug_folder_gives_triton_kernels_per_graph(bundle):
    assert bundle.route == "imported" and bundle.device == "cuda"
    assert [g.phase for g in bundle.graphs] == ["forward", "backward"]
    assert all(g.fusion_groups.get("FusedSchedulerNode", 0) > 0 for g in bundle.graphs)
    assert all(g.fusion_groups.get("ExternKernelSchedulerNode", 0) > 0 for g in bundle.graphs)
    gen = [k for k in bundle.kernels if not k.is_library]
    assert gen and all(k.backend == "triton" for k in gen)
    assert {k.kind for k in bundle.kernels} >= {"pointwise", "persistent_reduction", "mm", "bmm"}
    assert bundle.eager_ops_per_step is None and bundle.fragmentation_ratio is None
    assert any("imported" in l for l in bundle.limitations)


def test_foreign_paths_map_to_the_local_program(bundle):
    files = {s.file for k in bundle.kernels for s in k.sources}
    assert files == {"tiny_gpt.py"}
    lib = [k for k in bundle.kernels_in("forward") if k.kind == "mm"]
    assert lib and all(k.sources for k in lib)  # library calls matched to their nodes by order
    assert any(s.code.startswith("q = self.q(x)") for k in lib for s in k.sources)


def test_intents_from_imported_evidence(bundle):
    def one(p):
        found = bundle.intents_for(p)
        assert found, [i.id for i in bundle.intents]
        return found[0]

    assert covers(one("rms_norm"), "return x * torch.rsqrt(")
    assert covers(one("rotary"), "y1 = x1 * cos + x2 * sin")
    assert covers(one("attention"), "att = att.softmax(dim=-1)")
    assert covers(one("relu2"), "x = F.relu(x).square()")
    assert covers(one("softcap_cross_entropy"), "torch.tanh(logits / self.softcap)")
    assert any(s.label == "attention: qkv projection + QK-norm + rotary" for s in bundle.supernodes)


def test_single_output_code_and_log_use_kernel_headers_only():
    code_file = next(GRAPHS.glob("*forward*/output_code.py"))
    one = import_debug_output(code_file, source_root=FIX)
    log = import_debug_output(FIX / "output_code.log", source_root=FIX)
    for b in (one, log):
        assert [g.phase for g in b.graphs] == ["forward"]
        assert len(b.kernels) == len(one.kernels) > 10
        pats = {i.pattern for i in b.intents}
        assert {"rms_norm", "rotary", "attention", "relu2", "softcap_cross_entropy"} <= pats
        compiler = [i for i in b.intents if i.kind == "compiler"]
        assert all(i.grade != "A" and not i.spans for i in compiler)  # header evidence only


def test_parse_headers_launches_and_handles():
    code = next(GRAPHS.glob("*forward*/output_code.py")).read_text()
    oc = parse_output_code(code)
    k = next(d for d in oc.defs.values() if "softmax" in d.name and "log" not in d.name)
    assert k.kind == "persistent_reduction" and "aten.masked_fill" in k.aten and k.post_grad_nodes
    assert k.path and k.path.endswith(".py")
    names = [l.name for l in oc.launches]
    assert "extern_kernels.mm" in names and "extern_kernels.bmm" in names
    assert all(l.handle and l.handle.split(":")[0] == l.name for l in oc.launches)
    assert oc.generated + oc.library == len(oc.launches)


def test_log_splitting_and_post_fusion_groups():
    codes = split_output_code_log((FIX / "output_code.log").read_text())
    assert len(codes) == 1 and "def call(" in codes[0] and "Output code written to" not in codes[0]
    groups = parse_ir_post_fusion("op0_op1: FusedSchedulerNode(SchedulerNode,SchedulerNode)\n"
                                  "op2: ExternKernelSchedulerNode(ExternKernelOut)\nop3: SchedulerNode(x)\n")
    assert groups == {"FusedSchedulerNode": 1, "ExternKernelSchedulerNode": 1, "SchedulerNode": 1}


def test_source_filter():
    f = SourceFilter(FIX)
    assert f.rel("/gpu_box/modded/tiny_gpt.py") == "tiny_gpt.py"
    assert f.rel(str(FIX / "tiny_gpt.py")) == "tiny_gpt.py"
    assert f.rel("/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py") is None
    loc = f.frame_from_file_comment("# File: /gpu_box/modded/tiny_gpt.py:17 in norm, code: return x")
    assert loc.file == "tiny_gpt.py" and loc.line == 17 and loc.function == "norm"
    trace = ('  File "/gpu_box/modded/tiny_gpt.py", line 89, in forward\n    x = self.lambdas[0] * x\n'
             '  File "/x/site-packages/torch/nn/functional.py", line 3, in relu\n    return y\n')
    frames = f.frames_from_trace(trace)
    assert [(l.file, l.line, l.function) for l in frames] == [("tiny_gpt.py", 89, "forward")]
