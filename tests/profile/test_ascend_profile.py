"""Ascend profiler analysis on hand-built folders (tests/fixtures/ascend/), exact expected values.

Each fixture follows the torch_npu.profiler layout
(<scenario>/<worker>_<pid>_<ts>_ascend_pt/ASCEND_PROFILER_OUTPUT/) in the file formats
msprof-analyze reads (test_ascend_real_formats.py, docs/npu.md), with tiny files whose
numbers were chosen by hand, so every share below is worked out from the files.
"""

from __future__ import annotations


import pytest

from trainbridge.profile import ascend as A
from trainbridge.targets.npu_catalog import load_catalog

from tests.kits.paths import FIXTURES

FIX = FIXTURES / "ascend"
CATALOG = {e.name for e in load_catalog()}


def report(name, env=None):
    return A.analyse_ascend(FIX / name, env)


def one(r, rule):
    fs = [f for f in r.findings if f.rule == rule]
    assert len(fs) == 1, [f.rule for f in r.findings]
    return fs[0]


@pytest.mark.parametrize("name", ["host_bound", "compute_bound", "comm_heavy", "aicpu_mte2", "partial", "malformed"])
def test_every_suggestion_names_a_catalog_entry(name):
    r = report(name, env={"ASCEND_LAUNCH_BLOCKING": "1", "HCCL_ALGO": "level0:ring", "HOST_CACHE_CAPACITY": "0",
                          "ACLNN_CACHE_LIMIT": "100", "ASCEND_GLOBAL_LOG_LEVEL": "1"})
    assert r.schema_version == A.SCHEMA_VERSION
    for f in r.findings:
        assert f.suggestion is None or f.suggestion in CATALOG, f.suggestion


def test_host_bound_fixture():
    r = report("host_bound")
    assert r.verdict == "host-bound"
    bd = r.breakdown
    assert (bd.source, bd.steps, bd.step_us, bd.computing_us, bd.communication_us, bd.free_us) == \
        ("step_trace_time.csv", 2, 10000.0, 6000.0, 500.0, 3500.0)
    assert (bd.computing_share, bd.communication_share, bd.free_share) == pytest.approx((0.60, 0.05, 0.35))
    assert one(r, "free_time").suggestion == "TASK_QUEUE_ENABLE"
    assert one(r, "free_time.affinity").suggestion == "CPU_AFFINITY_CONF"
    assert r.kernel_time.vector_us == 140.0 and r.kernel_time.cube_us == 0.0
    assert r.files_missing == [] and r.skipped_rows == {}
    assert [s.op_type for s in r.top_op_types] == ["Mul", "Add", "Cast"]


def test_host_bound_affinity_patterns_and_source_lines():
    r = report("host_bound")
    want = {
        "affinity.rms_norm": ("npu_rms_norm", ["model.py:41"]),
        "affinity.rotary": ("npu_rotary_mul", ["model.py:58", "model.py:59", "model.py:62"]),
        "affinity.attention": ("npu_fusion_attention", ["model.py:75", "model.py:76", "model.py:77", "model.py:78"]),
        "affinity.swiglu": ("npu_swiglu", ["model.py:92", "model.py:93"]),
        "affinity.confusion_transpose": ("npu_confusion_transpose", ["model.py:80"]),
        "affinity.optimizer": ("NpuFusedAdamW", ["train.py:95"]),
    }
    got = {f.rule: (f.suggestion, f.source_lines) for f in r.findings if f.rule.startswith("affinity.")}
    assert got == want  # the softmax inside the attention block is not reported on its own
    assert one(r, "affinity.rms_norm").ops == ["aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul"]
    assert one(r, "affinity.attention").count == 1
    assert one(r, "affinity.optimizer").value == 50.0


def test_host_bound_online_compile():
    f = one(report("host_bound"), "schedule.online_compile")
    assert (f.count, f.suggestion, f.severity) == (21, "set_compile_mode", "high")


def test_compute_bound_fixture():
    r = report("compute_bound")
    assert r.verdict == "compute-bound"
    assert r.breakdown.free_share == pytest.approx(0.04) and r.breakdown.computing_share == pytest.approx(0.96)
    kt = r.kernel_time
    assert (kt.cube_us, kt.vector_us, kt.kernels) == (7200.0, 2400.0, 5) and kt.cube_share == pytest.approx(0.75)
    cube = one(r, "bound.cube")  # mac 0.96 / 0.95: msprof-analyze calls a cube op mac-bound only from 0.95
    assert (cube.ops, cube.count, cube.value, cube.suggestion) == (["MatMulV2"], 2, 0.96, "allow_hf32")
    al = one(r, "matmul_alignment")
    assert (al.value, al.count) == (1000.0, 1) and "1024" in al.message
    assert r.files_missing == ["operator_details.csv"]
    assert any("missing: operator_details.csv" in e for e in r.evidence)


def test_communication_heavy_fixture():
    r = report("comm_heavy")
    assert r.verdict == "communication-bound"
    bd = r.breakdown
    assert (bd.computing_share, bd.communication_share, bd.free_share) == pytest.approx((0.51, 0.39, 0.10))
    assert r.kernel_time.communication_us == 4000.0 and r.kernel_time.cube_share == pytest.approx(2 / 3)
    sms = one(r, "affinity.scaled_masked_softmax")  # per-event call stacks from trace_view.json
    assert sms.source_lines == ["layers.py:20", "layers.py:21", "layers.py:22"]
    opt = one(r, "affinity.optimizer")
    assert (opt.suggestion, opt.count, opt.value, opt.source_lines) == ("NpuFusedSGD", 2, 70.0, ["train.py:57"])
    assert r.files_missing == ["op_statistic.csv", "operator_details.csv"]


def test_aicpu_and_mte2_fixture():
    r = report("aicpu_mte2")
    assert r.verdict == "memory-bound"
    kt = r.kernel_time
    assert (kt.cube_us, kt.vector_us, kt.aicpu_us) == (1485.0, 5000.0, 3015.0)
    assert kt.vector_share + kt.aicpu_share == pytest.approx(8015 / 9500)
    ai = one(r, "aicpu")  # NonZero (15 us) stays under the 20 us rule
    assert (ai.ops, ai.count, ai.value, ai.severity) == (["IndexPut"], 1, 3000.0, "high")
    mem = [f for f in r.findings if f.rule == "bound.memory"]  # vec+mte2+mte3 < 0.9, so the advisor says "mte2"
    assert [(f.ops[0], f.value) for f in mem] == [("Add", 0.86), ("Mul", 0.85)]
    assert one(r, "bound.vector").ops == ["Cast"]
    assert not [f for f in r.findings if f.rule == "bound.cube"]


def test_aicpu_from_op_statistic_when_kernels_absent():
    rows = [A.OpStatRow(op_type="IndexPut", core_type="AI_CPU", count=2, total_us=600, avg_us=300, max_us=310),
            A.OpStatRow(op_type="NonZero", core_type="AI_CPU", count=5, total_us=50, avg_us=10, max_us=12)]
    fs = A.aicpu_ops(None, rows)
    assert [(f.ops, f.count) for f in fs] == [(["IndexPut"], 2)]


def test_partial_fixture_uses_kernel_gaps():
    r = report("partial")
    assert r.verdict == "host-bound"
    bd = r.breakdown
    assert (bd.source, bd.steps, bd.step_us, bd.computing_us, bd.free_us) == ("kernel_details.csv", 2, 500.0, 375.0, 125.0)
    assert bd.free_share == pytest.approx(0.25)
    assert r.kernel_time.cube_share == pytest.approx(0.3125)
    assert r.files_present == ["kernel_details.csv"]
    assert r.files_missing == ["step_trace_time.csv", "op_statistic.csv", "operator_details.csv", "trace_view.json"]


def test_malformed_fixture_skips_and_counts():
    r = report("malformed")
    assert r.skipped_rows == {"step_trace_time.csv": 2, "kernel_details.csv": 2}
    assert r.verdict == "host-bound" and r.breakdown.steps == 1 and r.breakdown.free_share == pytest.approx(0.20)
    assert r.kernel_time.kernels == 1
    w = "\n".join(r.warnings)
    assert "op_statistic.csv: lacks required columns ['Count']" in w
    assert "operator_details.csv: empty file" in w and "trace_view.json: not valid JSON" in w
    assert "step_trace_time.csv: skipped 2 malformed row(s)" in w


def test_block_num_alias_and_optional_step_id(tmp_path):
    prof = A.load_ascend_profile(FIX / "comm_heavy")  # no Step Id column, Block Dim as torch_npu writes it
    assert [k.block_dim for k in prof.kernels] == [24, 40, 0] and all(k.step_id is None for k in prof.kernels)
    assert [k.category for k in prof.kernels] == ["cube", "vector", "communication"]
    prof = A.load_ascend_profile(FIX / "partial")
    assert prof.kernels[0].start_us == 1741200000000.0 and prof.kernels[0].step_id == 1  # "\t"-suffixed
    assert prof.kernels[0].input_shapes == "4096"  # the cell's own quotes are stripped
    out = tmp_path / "x_ascend_pt" / "ASCEND_PROFILER_OUTPUT"  # older spellings: Block Num, Step ID
    out.mkdir(parents=True)
    (out / "kernel_details.csv").write_text("Step ID,Name,Type,Accelerator Core,Start Time(us),Duration(us),Block Num\n"
                                            "3,k,Add,AI_VECTOR_CORE,10,5,40\n")
    (k,) = A.load_ascend_profile(out).kernels
    assert (k.step_id, k.block_dim) == (3, 40)


def test_path_forms_and_errors(tmp_path):
    inner = next((FIX / "compute_bound").glob("*_ascend_pt"))
    for p in (FIX / "compute_bound", inner, inner / "ASCEND_PROFILER_OUTPUT"):
        assert A.analyse_ascend(p).verdict == "compute-bound"
    with pytest.raises(A.AscendProfileError, match="no torch_npu profiler output"):
        A.load_ascend_profile(tmp_path)
    (tmp_path / "x_ascend_pt" / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    with pytest.raises(A.AscendProfileError, match="none of"):
        A.load_ascend_profile(tmp_path)
    with pytest.raises(A.AscendProfileError, match="no such folder"):
        A.load_ascend_profile(tmp_path / "absent")


def test_environment_rules():
    env = {"ASCEND_LAUNCH_BLOCKING": "1", "PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:128",
           "ACLNN_CACHE_LIMIT": "5000", "HOST_CACHE_CAPACITY": "0", "HCCL_ALGO": "level0:ring",
           "ASCEND_GLOBAL_LOG_LEVEL": "1"}
    fs = {f.rule: f.suggestion for f in A.check_environment(env)}
    assert fs == {"env.launch_blocking": "ASCEND_LAUNCH_BLOCKING", "env.expandable_segments": "PYTORCH_NPU_ALLOC_CONF",
                  "env.aclnn_cache_limit": "ACLNN_CACHE_LIMIT", "env.host_cache_capacity": "HOST_CACHE_CAPACITY",
                  "env.hccl_algo": "HCCL_ALGO", "env.log_level": "ASCEND_GLOBAL_LOG_LEVEL"}
    good = {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "ACLNN_CACHE_LIMIT": "100000",
            "HOST_CACHE_CAPACITY": "20", "ASCEND_GLOBAL_LOG_LEVEL": "3", "TASK_QUEUE_ENABLE": "2"}
    assert A.check_environment(good) == []
    r = report("compute_bound", env=env)
    assert len([f for f in r.findings if f.rule.startswith("env.")]) == 6


def test_matmul_inner_axis_reading():
    assert A.matmul_inner_axis("4096,1000;1000,4096") == 1000
    assert A.matmul_inner_axis("8,128,64;8,256,64") == 64     # B transposed
    assert A.matmul_inner_axis("64,128;512,256") is None       # not a matmul shape pair
    assert A.matmul_inner_axis(None) is None


def test_top_level_aten_ignores_nested_children():
    ev = [A.TraceEvent(name=n, ts_us=t, dur_us=d, pid="1", tid="1") for n, t, d in
          (("aten::matmul", 0, 10), ("aten::bmm", 1, 5), ("aten::softmax", 11, 3), ("aten::_softmax", 11.5, 1))]
    assert [e.name for e in A.top_level_aten(ev)[("1", "1")]] == ["aten::matmul", "aten::softmax"]
