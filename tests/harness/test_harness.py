"""The zero-modification harness on a tiny program: steps, losses, failures, log lines."""

from pathlib import Path

import pytest
import torch

from trainbridge.harness.loglines import parse_line, parse_log
from trainbridge.harness.runner import run_workload
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES

TINY = FIXTURES / "harness" / "tiny"


def _tiny(args=(), **limits):
    wl = load_workload(TINY)
    m = wl.manifest.model_copy(update={"args": list(args)})
    if limits:
        m = m.model_copy(update={"limits": m.limits.model_copy(update=limits)})
    return wl.model_copy(update={"manifest": m})


def test_exact_steps_two_optimizers_one_step_and_falling_loss(tmp_path):
    r = run_workload(_tiny(), "cpu", out_dir=tmp_path, warmup_steps=2, measured_steps=6)
    assert r.status == "ok", r.error
    assert [s.phase for s in r.steps] == ["warmup"] * 2 + ["measured"] * 6
    assert r.optimizers_per_step == 2  # SGD + Adam stepped once each = one step
    assert len(r.measured_ms) == 6 and len(r.warmup_ms) == 2
    losses = [s.loss for s in r.steps]
    assert all(l is not None for l in losses) and losses[-1] < losses[0]
    assert all(s.work_items == 32 and s.backward_calls == 1 for s in r.steps)
    assert r.environment.torch_threads >= 1 and len(r.environment.program_sha256) == 64
    assert r.peak_memory_mb > 0


def test_gradient_accumulation_stays_inside_a_step(tmp_path):
    r = run_workload(_tiny(["accumulate"]), "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=3)
    assert r.status == "ok"
    assert [s.backward_calls for s in r.steps] == [2, 2, 2, 2]
    assert all(s.work_items == 64 for s in r.steps)


def test_instruments_run_on_their_own_steps(tmp_path):
    r = run_workload(_tiny(), "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=2,
                     profile_steps=2, count_ops=True, count_flops=True)
    assert r.status == "ok"
    assert [s.phase for s in r.steps] == ["warmup", "measured", "measured", "profile", "profile",
                                         "count_ops", "count_flops"]
    assert r.ops_per_step.total > 20 and "aten.addmm" in r.ops_per_step.by_op
    assert r.flops_per_step > 0
    assert Path(r.profile_trace_path).stat().st_size > 0
    assert any(row["name"] == "aten::addmm" for row in r.profile_ops)


def test_compiled_graphs_are_counted_only_inside_the_steps(tmp_path):
    plain = run_workload(_tiny(), "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=2)
    init = run_workload(_tiny(["compile_init"]), "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=2)
    step = run_workload(_tiny(["compile_step"]), "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=2)
    assert plain.status == init.status == step.status == "ok", (init.error, step.error)
    assert plain.compiled_graphs_in_steps is None  # nothing compiled at all
    assert init.compiled_graphs_in_steps == 0  # compiled before the first forward: not on the step's path
    assert step.compiled_graphs_in_steps >= 1


def test_step_functions_are_those_a_step_calls(tmp_path):
    r = run_workload(_tiny(), "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=1, count_ops=True)
    assert r.status == "ok", r.error
    assert r.step_functions["train.py:Net.forward"] == 1  # once per step
    assert "train.py:main" not in r.step_functions  # entered before training, never called in a step
    assert not any("torch" in k for k in r.step_functions)  # only the program's own files
    plain = run_workload(_tiny(), "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=1)
    assert plain.step_functions is None  # recorded on the op-count step only


def test_crashing_program_reports_why(tmp_path):
    r = run_workload(_tiny(["crash"]), "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=5)
    assert r.status == "crashed"
    assert "deliberate failure at step 3" in r.error
    assert len(r.steps) == 3  # the steps before the crash are kept


def test_hanging_program_is_killed(tmp_path):
    r = run_workload(_tiny(["hang"]), "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=5, timeout_s=6)
    assert r.status == "timeout"
    assert "time-out" in r.error and len(r.steps) == 2
    assert r.wall_s < 30


def test_out_of_memory_program_is_killed(tmp_path):
    r = run_workload(_tiny(["oom"], memory_limit_mb=900), "cpu", out_dir=tmp_path,
                     warmup_steps=1, measured_steps=200)
    assert r.status == "oom"
    assert "MiB" in r.error and len(r.steps) < 200


def test_program_that_ends_early(tmp_path):
    r = run_workload(_tiny(["early"]), "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=10)
    assert r.status == "finished_early" and len(r.steps) == 4


def test_unmodified_script_with_its_own_log_lines(tmp_path):
    r = run_workload(_tiny(["loglines"]), "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=5)
    assert r.status == "ok"
    assert [l.step for l in r.program_log] == [1, 2, 3, 4, 5]
    assert all(l.train_loss is not None and l.train_time_ms >= 0 for l in r.program_log)


def test_loglines_all_record_formats():
    a = parse_line("step:125/1750 val_loss:4.2341 train_time:56012ms step_avg:448.10ms")
    assert a.val_loss == pytest.approx(4.2341) and a.step_avg_ms == pytest.approx(448.1)
    b = parse_line("step:3/5100 train_loss:10.8 train_time:1234ms step_avg:nanms")
    assert b.train_loss == pytest.approx(10.8) and b.step_avg_ms is None
    c = parse_line("step:1000/1390 train_time:98011ms step_avg:98.01ms")
    assert c.total_steps == 1390 and c.val_loss is None and c.train_loss is None
    assert parse_line("peak memory allocated: 100 MiB reserved: 120 MiB") is None
    assert len(parse_log("noise\nstep:1/2 train_time:5ms step_avg:5.00ms\n")) == 1


def test_relative_out_dir_works_from_any_working_directory(tmp_path, monkeypatch):
    """`trainbridge profile` defaults to runs/...: a relative folder must still reach the child."""
    monkeypatch.chdir(tmp_path)
    r = run_workload(_tiny(), "cpu", out_dir="runs/rel", warmup_steps=1, measured_steps=2)
    assert r.ok, r.error
    assert (tmp_path / "runs" / "rel" / "results").is_dir()


def test_peak_memory_is_the_programs_own_not_its_parents(tmp_path):
    """Linux carries ru_maxrss across fork and exec: a parent holding 1 GB made every child
    report 1 GB (the records runner's children all read 4545 MB). The child reports its own."""
    ballast = bytearray(1024 * 2**20)  # the parent's memory, touched
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    r = run_workload(_tiny(), "cpu", out_dir=tmp_path, warmup_steps=1, measured_steps=2)
    del ballast
    assert r.status == "ok", r.error
    assert 0 < r.peak_memory_mb < 1000, r.peak_memory_mb


def test_an_optimizer_written_as_a_plain_class_ends_each_step(tmp_path):
    """The 2026 records' NorMuonAndAdam is no torch.optim.Optimizer: without its own hook the
    harness saw no step and let the program run to its end ("timeout at step 0 of 6"). A
    schedule with a step() but no parameters must not count as a second optimizer."""
    from trainbridge.harness.handwritten_optimizers import holds_parameters

    wl = load_workload(TINY.parent / "handwritten_optim")
    r = run_workload(wl, "cpu", out_dir=tmp_path, warmup_steps=2, measured_steps=4)
    assert r.status == "ok", r.error
    assert len(r.steps) == 6 and r.optimizers_per_step == 1
    assert all(s.backward_calls == 1 and s.work_items == 8 for s in r.steps)
    assert "ran to the end" not in (tmp_path / "results").joinpath(
        next(p.name for p in (tmp_path / "results").glob("*.stdout.log"))).read_text()
    p = torch.nn.Parameter(torch.zeros(1))
    assert holds_parameters(type("O", (), {"__init__": lambda s: setattr(s, "groups", [{"params": [p]}])})())
    assert not holds_parameters(type("S", (), {"__init__": lambda s: setattr(s, "t", 0)})())
