"""Work conservation on RunResults built by hand: skipped work in each of its forms must fail."""

from __future__ import annotations

from trainbridge.harness.models import ElementwiseCount, RunRequest, RunResult, StepRecord
from trainbridge.measure.work import check_work

TOKENS = 512
FLOPS = 2_000_000_000


ELEMENTWISE = {"mul": 600_000, "tanh": 200_000, "exp": 150_000, "sum": 50_000}


def run(*, work_items=TOKENS, flops: int | None = FLOPS, warmup=2, measured=4, backward_calls=1,
        items_per_step: dict[int, int] | None = None, elementwise: dict[str, int] | None = ELEMENTWISE,
        opaque: dict[str, int] | None = None) -> RunResult:
    req = RunRequest(script="/nonexistent/train.py", cwd="/nonexistent", result_path="/nonexistent/r.json",
                     steps_path="/nonexistent/s.jsonl", warmup_steps=warmup, measured_steps=measured,
                     count_flops_step=True)
    phases = ["warmup"] * warmup + ["measured"] * measured + ["count_flops"]
    steps = [StepRecord(index=i, phase=p, step_ms=10.0, loss=3.0, backward_calls=backward_calls,
                        work_items=(items_per_step or {}).get(i, work_items))
             for i, p in enumerate(phases, start=1)]
    elem = None if elementwise is None else ElementwiseCount(total=sum(elementwise.values()), by_op=elementwise,
                                                             opaque=opaque or {})
    return RunResult(status="ok", request=req, steps=steps, flops_per_step=flops, elementwise_per_step=elem)


def test_equal_work_passes():
    v = check_work(run(), run())
    assert v.passed, v.reason
    assert v.work_items_baseline == v.work_items_candidate == 7 * TOKENS and v.flops_ratio == 1.0


def test_smaller_batch_fails():
    v = check_work(run(), run(work_items=TOKENS // 2))
    assert not v.passed and v.first_mismatch_step == 1
    assert "256 work items" in v.reason and "baseline 512" in v.reason


def test_one_short_step_fails():
    v = check_work(run(), run(items_per_step={5: TOKENS - 1}))
    assert not v.passed and v.first_mismatch_step == 5 and "step 5 (measured)" in v.reason


def test_fewer_layers_fail_on_flops():
    v = check_work(run(), run(flops=int(FLOPS * 0.75)))
    assert not v.passed and "fell 25.0%" in v.reason and v.flops_ratio == 0.75


def test_flops_within_tolerance_pass_and_higher_flops_are_recorded():
    assert check_work(run(), run(flops=int(FLOPS * 0.995))).passed
    v = check_work(run(), run(flops=int(FLOPS * 1.2)))
    assert v.passed and v.flops_ratio == 1.2 and any("rose 20.0%" in n for n in v.notes)


def test_missing_flops_name_the_side():
    v = check_work(run(), run(flops=None))
    assert not v.passed and "candidate flops_per_step missing" in v.reason
    v = check_work(run(flops=None), run())
    assert not v.passed and "baseline flops_per_step missing" in v.reason


def test_fewer_steps_fail():
    v = check_work(run(), run(measured=3))
    assert not v.passed and "2 warmup + 3 measured" in v.reason and "baseline 2 + 4" in v.reason


def test_missing_work_items_name_the_side():
    v = check_work(run(work_items=0), run(work_items=0))
    assert not v.passed and v.reason.startswith("baseline work_items missing")
    v = check_work(run(), run(work_items=0))
    assert not v.passed and v.reason.startswith("candidate work_items missing")


def test_skipped_backward_fails():
    v = check_work(run(), run(backward_calls=0))
    assert not v.passed and "backward" in v.reason


def test_baseline_without_measured_steps_fails():
    v = check_work(run(measured=0), run())
    assert not v.passed and "no measured steps" in v.reason


def test_deleted_elementwise_work_fails_with_the_ops_that_fell():
    # a softcap's tanh (and its divide and multiply) gone: the FLOPs, counting GEMMs only, are unchanged
    v = check_work(run(), run(elementwise={**ELEMENTWISE, "tanh": 0, "mul": 500_000}))
    assert not v.passed
    assert "elementwise work per step fell 30.0%" in v.reason and "work was deleted" in v.reason
    assert "tanh 200,000 -> 0" in v.reason and "mul 600,000 -> 500,000" in v.reason
    assert v.flops_ratio == 1.0 and v.elementwise_ratio == 0.7


def test_elementwise_work_may_move_within_the_tolerance_and_rise():
    # two spellings of one region differ (a fused norm's decomposition counts a fifth less)
    assert check_work(run(), run(elementwise={**ELEMENTWISE, "mul": 520_000})).passed
    v = check_work(run(), run(elementwise={**ELEMENTWISE, "mul": 900_000}))
    assert v.passed and v.elementwise_ratio > 1 and "elementwise work 1,000,000 -> 1,300,000" in v.reason


def test_a_fall_beside_an_op_the_counter_cannot_see_is_a_note_not_a_verdict():
    # a vendor kernel on the NPU (no decomposition, no formula) hides its work from the count
    v = check_work(run(), run(elementwise={**ELEMENTWISE, "exp": 0, "mul": 300_000},
                              opaque={"npu.npu_fusion_attention": 2}))
    assert v.passed
    assert any("npu.npu_fusion_attention" in n and "not decisive" in n for n in v.notes), v.notes
    # an opaque op the baseline already called explains nothing
    both = check_work(run(opaque={"npu.npu_fusion_attention": 2}),
                      run(elementwise={**ELEMENTWISE, "exp": 0, "mul": 300_000},
                          opaque={"npu.npu_fusion_attention": 2}))
    assert not both.passed and "work was deleted" in both.reason


def test_a_missing_elementwise_count_is_said_not_failed():
    v = check_work(run(elementwise=None), run())
    assert v.passed and any("elementwise work not compared: the baseline has no count" in n for n in v.notes)
