"""The step clock lives in the parent: a program that forges the child's clock or the boundary
signals is caught, and an honest program's times are the parent's.

The grammar tests feed the reader messages with chosen stamps; the attack tests run the tiny
harness program with a few lines prepended, through the real harness, and the loop-level
test sends a forging candidate through `validate`.
"""

import os
import shutil

import pytest

from trainbridge.harness.boundaries import TOLERANCE_MS, BoundaryReader, apply_parent_clock
from trainbridge.harness.models import StepRecord
from trainbridge.harness.runner import run_workload
from trainbridge.measure.timed_runs import fingerprint_problem
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES

TINY = FIXTURES / "harness" / "tiny"
HEAD = "import torch.nn.functional as F\n"
MS = 1_000_000  # ns

# Every step sleeps 80 ms inside the loss, so a forged clock has something to misreport.
SLOW_STEP = """
import time as _time
_ce = F.cross_entropy
def _slow_ce(*a, **k):
    _time.sleep(0.08)
    return _ce(*a, **k)
F.cross_entropy = _slow_ce
"""
# A clock running at a quarter of real speed, installed without spelling `time.perf_counter =`.
QUARTER_CLOCK = """
_t = __import__("ti" + "me")
_real = _t.perf_counter
setattr(_t, "perf_" + "counter", lambda: _real() * 0.25)
"""
# Extra "a step starts" messages on every pipe the program can find, after each optimizer step.
FORGED_SIGNALS = """
import struct as _struct
from torch.optim.optimizer import register_optimizer_step_post_hook as _post
def _forge(*a):
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                os.write(int(fd), _struct.pack("<cI", b"S", 0))
        except OSError:
            pass
_post(_forge)
"""


def _feed(reader: BoundaryReader, messages: list[tuple[bytes, int, int]]) -> None:
    for kind, index, stamp_ms in messages:
        reader._on_message(kind, index, stamp_ms * MS)


def _close(reader: BoundaryReader) -> None:
    os.close(reader.read_fd)
    os.close(reader.write_fd)


def test_steps_are_timed_between_the_parents_stamps():
    r = BoundaryReader()
    _feed(r, [(b"S", 0, 0), (b"E", 1, 30), (b"S", 0, 32), (b"E", 2, 52)])
    _close(r)
    assert {i: s.step_ms for i, s in r.steps.items()} == {1: 30.0, 2: 20.0} and not r.problems


def test_the_first_step_closed_late_ends_at_its_last_optimizer_step():
    r = BoundaryReader()
    _feed(r, [(b"S", 0, 0), (b"T", 0, 10), (b"T", 0, 14), (b"L", 1, 25), (b"E", 2, 40)])
    _close(r)
    assert r.steps[1].step_ms == 14.0 and r.steps[2].step_ms == 26.0 and not r.problems


@pytest.mark.parametrize("messages, why", [
    ([(b"S", 0, 0), (b"S", 0, 5), (b"E", 1, 30)], "start message inside a running step"),
    ([(b"S", 0, 0), (b"E", 1, 30), (b"E", 2, 40)], "where a step start was due"),
    ([(b"S", 0, 0), (b"E", 1, 30), (b"S", 0, 31), (b"E", 1, 40)], "ended twice"),
    ([(b"S", 0, 0), (b"X", 1, 30)], "unknown boundary message"),
])
def test_messages_out_of_grammar_are_problems(messages, why):
    r = BoundaryReader()
    _feed(r, messages)
    _close(r)
    assert any(why in p for p in r.problems), r.problems


def test_the_parents_time_replaces_the_childs_and_a_disagreement_is_named():
    r = BoundaryReader()
    _feed(r, [(b"S", 0, 0), (b"E", 1, 50), (b"S", 0, 50), (b"E", 2, 100)])
    _close(r)
    honest = [StepRecord(index=1, phase="warmup", step_ms=49.0), StepRecord(index=2, phase="measured", step_ms=50.5)]
    assert apply_parent_clock(honest, r, complete=True) is None
    assert [(s.step_ms, s.child_step_ms) for s in honest] == [(50.0, 49.0), (50.0, 50.5)]
    forged = [StepRecord(index=1, phase="warmup", step_ms=49.0), StepRecord(index=2, phase="measured", step_ms=12.0)]
    why = apply_parent_clock(forged, r, complete=True)
    assert why and "step 2" in why and "12.0 ms" in why and forged[1].step_ms == 50.0
    missing = [StepRecord(index=3, phase="measured", step_ms=50.0)]
    assert "never signalled" in apply_parent_clock(missing, r, complete=True)


def test_a_step_shorter_than_the_parents_wake_up_keeps_the_childs_time_within_the_parents_bound():
    r = BoundaryReader()
    r._previous_read_ns = 10 * MS
    _feed(r, [(b"S", 0, 12), (b"E", 1, 12)])  # start and end came in one read at 12 ms, the read before at 10
    _close(r)
    assert r.steps[1].same_read and r.steps[1].max_ms == 2.0
    short = [StepRecord(index=1, phase="measured", step_ms=0.4)]
    assert apply_parent_clock(short, r, complete=True) is None and short[0].step_ms == 0.4
    long = [StepRecord(index=1, phase="measured", step_ms=90.0)]
    assert "at most 2.0 ms" in apply_parent_clock(long, r, complete=True)


# ------------------------------------------------------------- real harness ----
def _tiny(tmp_path):
    root = tmp_path / "workload"
    if not root.exists():
        shutil.copytree(TINY, root)
    return load_workload(root)


def _run(tmp_path, prelude: str, label: str = "run"):
    text = (TINY / "train.py").read_text()
    assert HEAD in text
    return run_workload(_tiny(tmp_path), "cpu", out_dir=tmp_path / "out", label=label,
                        sources={"train.py": text.replace(HEAD, HEAD + prelude, 1)}, warmup_steps=1, measured_steps=3)


def test_an_honest_run_is_timed_by_the_parent_and_agrees_with_its_own_clock(tmp_path):
    r = _run(tmp_path, SLOW_STEP)
    assert r.status == "ok", r.error
    assert all(s.child_step_ms is not None and s.step_ms >= 70.0 for s in r.steps)
    assert all(abs(s.step_ms - s.child_step_ms) < TOLERANCE_MS for s in r.steps), \
        [(s.step_ms, s.child_step_ms) for s in r.steps]


def test_a_clock_forged_inside_the_program_is_caught_and_not_believed(tmp_path):
    r = _run(tmp_path, SLOW_STEP + QUARTER_CLOCK)
    assert r.status == "tampered" and "the program's clock says" in r.error, (r.status, r.error)
    assert all(s.step_ms >= 70.0 for s in r.steps), "the recorded time must be the parent's, not the forged one"


def test_boundary_signals_forged_by_the_program_are_caught(tmp_path):
    r = _run(tmp_path, SLOW_STEP + "import os\n" + FORGED_SIGNALS)
    assert r.status == "tampered" and "start message inside a running step" in r.error, (r.status, r.error)


def test_nothing_a_run_leaves_in_its_program_folder_reaches_the_next_run(tmp_path):
    marker = """
import os as _os
if _os.path.exists("validated_once"):
    raise SystemExit(3)  # a program that would cheat from its second run on
open("validated_once", "w").write("x")
"""
    first, second = _run(tmp_path, marker, "first"), _run(tmp_path, marker, "second")
    assert first.status == "ok" and second.status == "ok", second.error


def test_a_timed_run_of_other_files_than_validation_ran_is_named(tmp_path):
    validated, other = _run(tmp_path, "", "validate"), _run(tmp_path, "# changed after validation\n", "timed")
    assert fingerprint_problem(validated, validated) is None
    why = fingerprint_problem(other, validated)
    assert why and "not the ones validated" in why
