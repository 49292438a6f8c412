"""Lockstep timing: two live children take turns one step at a time.

Each arm is the tiny harness program with a few lines prepended that append the arm's
name to a shared log at every optimizer step; the log shows who stepped when.
"""

import shutil

from trainbridge.harness.lockstep import run_lockstep
from trainbridge.harness.runner import prepare_run
from trainbridge.measure.timing import lockstep_session
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES

TINY = FIXTURES / "harness" / "tiny"
HEAD = "import torch.nn.functional as F\n"


def _program(arm: str, log, sleep_s: float = 0.01) -> dict[str, str]:
    prelude = f"""
import time as _time
from torch.optim.optimizer import register_optimizer_step_post_hook as _post
def _mark(opt, *a):
    if isinstance(opt, torch.optim.Adam):  # one of the program's two optimizers: once a step
        _time.sleep({sleep_s})
        with open({str(log)!r}, "a") as f:
            f.write("{arm}")
_post(_mark)
"""
    text = (TINY / "train.py").read_text()
    return {"train.py": text.replace(HEAD, HEAD + "import torch\n" + prelude, 1)}


def _workload(tmp_path):
    root = tmp_path / "workload"
    if not root.exists():
        shutil.copytree(TINY, root)
    return load_workload(root)


def test_two_children_take_turns_step_by_step(tmp_path):
    wl, log = _workload(tmp_path), tmp_path / "steps.log"
    arms = {a: prepare_run(wl, "cpu", out_dir=tmp_path / a, label=a, sources=_program(a, log), warmup_steps=2,
                           measured_steps=4) for a in ("A", "B")}
    ls = run_lockstep(arms, ["B", "A"])
    assert ls.problem is None, ls.problem
    assert all(len(r.measured_ms) == 4 for r in ls.results.values())
    seq = log.read_text()  # the last step's hook never runs: the harness stops the program there
    assert len(seq) == 10 and seq.count("A") == seq.count("B") == 5, seq
    # after the first steps (start-up runs both at once), strict alternation, B first at every tie
    assert seq[-8:] == "BABABABA", seq
    # blocked at their gates, the waiting arms used next to no CPU while the other stepped
    assert all(ls.busy_waiting[a] == 0 for a in "AB") and len(ls.waiting_cpu_ms["A"]) >= 4, ls.waiting_cpu_ms


def test_a_crashed_arm_leaves_the_other_to_finish_and_drops_the_round(tmp_path):
    wl, log = _workload(tmp_path), tmp_path / "steps.log"
    crash = {"train.py": _program("B", log)["train.py"].replace("mode = sys.argv[1] if len(sys.argv) > 1 else "
                                                                "\"normal\"", "mode = 'crash'")}
    assert crash["train.py"] != _program("B", log)["train.py"]
    arms = {"A": prepare_run(wl, "cpu", out_dir=tmp_path / "A", label="A", sources=_program("A", log),
                             warmup_steps=2, measured_steps=3),
            "B": prepare_run(wl, "cpu", out_dir=tmp_path / "B", label="B", sources=crash, warmup_steps=2,
                             measured_steps=3)}
    ls = run_lockstep(arms, ["A", "B"])
    assert ls.results["A"].status == "ok", ls.results["A"].error
    assert ls.results["B"].status != "ok" and ls.problem and "B run" in ls.problem


def test_a_lockstep_session_has_the_shape_of_process_pairs(tmp_path):
    wl, log = _workload(tmp_path), tmp_path / "steps.log"
    wl = wl.model_copy(update={"manifest": wl.manifest.model_copy(update={
        "steps": wl.manifest.steps.model_copy(update={"warmup": 2, "measured": 3})})})
    s = lockstep_session(wl, "cpu", {"incumbent": _program("A", log), "candidate": _program("B", log)}, 2,
                         out_dir=tmp_path / "session", seed=1)
    assert s.scheme == "lockstep" and s.rounds_kept == 2 and not s.problems and s.violation is None
    assert s.orders == [["incumbent", "candidate"], ["candidate", "incumbent"]]
    # every measured step holds its 10 ms sleep; a parent's stamp may still wait for a wake-up (the
    # reader thread's turn at the GIL, within one switch interval while timing, and the scheduler's)
    assert all(len(run) == 3 for runs in s.runs_ms.values() for run in runs), s.runs_ms
    assert min(x for runs in s.runs_ms.values() for run in runs for x in run) >= 10.0 - 1.5, s.runs_ms


def _spinning_program(log, spin_s: float) -> dict[str, str]:
    """The tiny program whose Adam step leaves a thread busy for `spin_s` after it, as OpenMP workers
    spin after a parallel region; the thread logs when it stops."""
    prelude = f"""
import sys as _sys
import threading as _threading
import time as _time
_sys.setswitchinterval(1e-4)  # the spinning thread hands the GIL back at once: the step ends while it spins
from torch.optim.optimizer import register_optimizer_step_pre_hook as _pre
def _spin():
    t = _time.monotonic()
    while _time.monotonic() - t < {spin_s}:
        pass
    with open({str(log)!r}, "a") as f:
        f.write(f"spin-end {{_time.monotonic()}}\\n")
def _start_spin(opt, *a):
    if isinstance(opt, torch.optim.Adam):
        _threading.Thread(target=_spin, daemon=True).start()
_pre(_start_spin)
"""
    text = (TINY / "train.py").read_text()
    return {"train.py": text.replace(HEAD, HEAD + "import torch\n" + prelude, 1)}


def _marking_program(log) -> dict[str, str]:
    prelude = f"""
import time as _time
from torch.optim.optimizer import register_optimizer_step_pre_hook as _pre
def _mark(opt, *a):
    if isinstance(opt, torch.optim.Adam):
        with open({str(log)!r}, "a") as f:
            f.write(f"other-step {{_time.monotonic()}}\\n")
_pre(_mark)
"""
    text = (TINY / "train.py").read_text()
    return {"train.py": text.replace(HEAD, HEAD + "import torch\n" + prelude, 1)}


def test_the_next_arm_waits_until_the_last_one_stops_running(tmp_path):
    """A waiting arm whose threads still run (OpenMP workers spinning after a parallel region) would
    take a core from the arm being measured: the other arm is released only once it is quiet."""
    wl, log = _workload(tmp_path), tmp_path / "times.log"
    arms = {"spinner": prepare_run(wl, "cpu", out_dir=tmp_path / "s", label="spinner",
                                   sources=_spinning_program(log, 0.06), warmup_steps=2, measured_steps=4),
            "other": prepare_run(wl, "cpu", out_dir=tmp_path / "o", label="other", sources=_marking_program(log),
                                 warmup_steps=2, measured_steps=4)}
    ls = run_lockstep(arms, ["spinner", "other"])
    assert ls.problem is None, ls.problem
    waits = ls.settle_ms["spinner"]
    assert len(waits) >= 4 and sum(w >= 30 for w in waits) >= 3, waits  # it waited out the spin
    assert max(ls.settle_ms["other"]) < 30, ls.settle_ms["other"]
    assert ls.unsettled == {"spinner": 0, "other": 0}
    events = [(kind, float(t)) for kind, t in (line.split() for line in log.read_text().splitlines())]
    spins = [t for kind, t in events if kind == "spin-end"]
    others = [t for kind, t in events if kind == "other-step"]
    assert len(spins) >= 4 and len(others) >= 5, events
    # once the turns began (start-up and the first, late-closed step run freely), no step of the
    # other arm began while the spinner's thread was still running
    during = [o for o in others for s in spins[2:] if s - 0.06 < o < s]
    assert not during, events


def test_an_arm_that_never_stops_running_has_its_rounds_dropped(tmp_path):
    """The attack: a candidate whose background thread never sleeps would burn a core while the
    incumbent is measured, making it look slow. It cannot be waited out: the next arm is released
    at the cap, and the round is dropped with the reason, so no pair is made of it."""
    wl, log = _workload(tmp_path), tmp_path / "times.log"
    wl = wl.model_copy(update={"manifest": wl.manifest.model_copy(update={
        "steps": wl.manifest.steps.model_copy(update={"warmup": 2, "measured": 2})})})
    text = (TINY / "train.py").read_text()
    forever = {"train.py": text.replace(HEAD, HEAD + """import sys as _sys
import threading as _threading
_sys.setswitchinterval(1e-4)
def _forever():
    while True:
        pass
_threading.Thread(target=_forever, daemon=True).start()
""", 1)}
    s = lockstep_session(wl, "cpu", {"incumbent": forever, "candidate": _marking_program(log)}, 1,
                         out_dir=tmp_path / "session", seed=1)
    assert s.rounds_kept == 0 and s.violation is None
    assert any("dropped" in p and "incumbent was still running after" in p for p in s.problems), s.problems


def test_an_arm_that_sleeps_through_the_boundary_and_computes_during_the_other_step_is_caught(tmp_path):
    """The attack quiescence alone misses: a thread that is asleep when the arm's step ends (so the
    arm looks quiet and the other arm is released) and then wakes to burn a core while the other
    arm is measured. The waiting arm's CPU time across the other arm's step gives it away, and its
    rounds are dropped."""
    wl, log = _workload(tmp_path), tmp_path / "steps.log"
    text = (TINY / "train.py").read_text()
    sleeper = {"train.py": text.replace(HEAD, HEAD + """import torch
import sys as _sys
import threading as _threading
import time as _time
_sys.setswitchinterval(1e-4)
torch.set_num_threads(1)  # no OpenMP workers spinning after the step: the sleep is seen at once
from torch.optim.optimizer import register_optimizer_step_post_hook as _post
def _sleep_then_burn():
    _time.sleep(0.015)  # asleep through the settle: the arm looks quiescent
    t = _time.monotonic()
    while _time.monotonic() - t < 0.03:  # then busy while the other arm steps
        pass
def _arm(opt, *a):
    if isinstance(opt, torch.optim.Adam):
        _threading.Thread(target=_sleep_then_burn, daemon=True).start()
_post(_arm)
""", 1)}
    arms = {"sleeper": prepare_run(wl, "cpu", out_dir=tmp_path / "s", label="sleeper", sources=sleeper,
                                   warmup_steps=2, measured_steps=4),
            "other": prepare_run(wl, "cpu", out_dir=tmp_path / "o", label="other",
                                 sources=_program("other", log, sleep_s=0.06), warmup_steps=2, measured_steps=4)}
    ls = run_lockstep(arms, ["sleeper", "other"])
    assert ls.unsettled == {"sleeper": 0, "other": 0}, ls.settle_ms  # quiescence alone is fooled
    assert ls.busy_waiting["sleeper"] >= 3, ls.waiting_cpu_ms
    assert sum(ms >= 10 for ms in ls.waiting_cpu_ms["sleeper"]) >= 3, ls.waiting_cpu_ms
    assert ls.busy_waiting["other"] == 0, ls.waiting_cpu_ms
    assert ls.problem and "sleeper used CPU while waiting at its gate" in ls.problem, ls.problem


def test_boundaries_are_stamped_under_a_short_switch_interval_and_it_is_restored():
    """A boundary message waits for the GIL before it is stamped: while children are timed the parent
    hands it over within half a millisecond, and leaves the interpreter as it found it after."""
    import sys

    from trainbridge.harness.boundaries import STAMP_SWITCH_INTERVAL_S, prompt_stamps

    before = sys.getswitchinterval()
    with prompt_stamps():
        assert sys.getswitchinterval() <= STAMP_SWITCH_INTERVAL_S < before
    assert sys.getswitchinterval() == before
