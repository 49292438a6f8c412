"""One table of ATen operator families: the harness, the profile analysis and the evidence
read their sets from `trainbridge.aten_ops`, so "is this matrix-engine work?" has one answer."""

from trainbridge import aten_ops as ops
from trainbridge.evidence import build, capture_session, importer, intents
from trainbridge.harness import child
from trainbridge.profile import analysis


def test_every_stage_reads_the_shared_families():
    assert child.GEMM_OPS == ops.dispatcher_names(ops.PRECISION_GEMMS)
    assert analysis.GEMM_OPS == ops.profiler_names(ops.MATRIX_ENGINE)
    assert build._MM == importer._MM_OPS == ops.GRAPH_LIBRARY_CALLS
    assert ops.FUSED_ATTENTION <= capture_session._MATMUL_OPS and ops.FUSED_ATTENTION <= intents._LIB_OPS


def test_the_families_nest():
    # a precision change shows in the GEMMs' dtypes; those are matrix-engine work, as are the
    # library calls an Inductor graph leaves out of its generated kernels
    assert ops.PRECISION_GEMMS <= ops.MATRIX_ENGINE
    assert ops.GRAPH_LIBRARY_CALLS <= ops.MATRIX_ENGINE
    assert ops.profiler_names({"mm"}) == {"aten::mm"} and ops.dispatcher_names({"mm"}) == {"aten.mm"}
