"""Lockstep timing: two programs alive at once, taking turns one step at a time.

Process pairs (`measure.timing.interleave`) run the incumbent and the candidate one after the
other, seconds apart, so a burst of host activity or a slow stretch of the machine falls on
one arm's run and not the other's. In lockstep both children start together; after each
step a child waits at its step gate (a pipe the parent writes one byte to) and the parent
lets the other child run its step, so step k of the candidate is measured right after step
k of the incumbent, and drift is shared at the scale of one step. Exactly one child runs a
step at any time: only steps started by a release count as measured alone
(`LockstepResult.overlapped`), and steps before the first release (start-up, the first
warm-up steps) may overlap.

The next arm is released only once the arm that just ended its step is quiescent (no
thread running: `quiescence`): OpenMP workers spin for milliseconds after a parallel region,
and a spinning waiter took a core from the arm being measured. The wait lies between two
measured steps and counts for neither; the time waited is kept (`LockstepResult.settle_ms`).
An arm that ran its last step is waited out to its exit: its teardown would otherwise run
beside the other arm's last step.

Quiescence at the release is not enough against a program that wants the other arm slow: a
thread that sleeps through the boundary and wakes to compute while the other arm is measured
looks quiescent. So the CPU time of every waiting arm is read when the next arm is released
and again when that arm's step ends (`quiescence.cpu_time`); a waiting arm that used more
than `BUSY_WAITING_MS` plus `BUSY_WAITING_REL` of the step has its round dropped, as an
unsettled one is. Legitimate programs use next to none: their threads are blocked on the gate.

Whether this resolves smaller effects than process pairs on a given machine is measured,
not assumed: `benchmarks/calibration.py --scheme pairs|lockstep` compares the two (on a 2-core
EPYC, a lockstep round's step-paired log ratio scattered 5.7x less than a process pair's).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from pydantic import BaseModel, Field

from .boundaries import prompt_stamps
from .models import RunResult
from .quiescence import CpuTime, cpu_time, wait_exited, wait_quiescent
from .runner import _POLL_S, ChildRun, PreparedRun

SETTLE_CAP_S = 0.1  # a waiting arm still running after this is left running (and counted as unsettled)
END_CAP_S = 30.0  # an arm past its last step gets this long to exit before the other arm's last step
BUSY_WAITING_MS = 1.0  # CPU a waiting arm may use during the other arm's step: this much ...
BUSY_WAITING_REL = 0.02  # ... plus this share of the step


class LockstepResult(BaseModel):
    results: dict[str, RunResult]
    order: list[str] = Field(..., description="who ran first whenever both had finished the same number of steps")
    overlapped: dict[str, list[int]] = Field(default_factory=dict, description="per arm, measured steps that did "
                                             "not start by a release (they may have run beside the other arm)")
    settle_ms: dict[str, list[float]] = Field(
        default_factory=dict, description="per arm, after each of its steps: how long it took to stop running "
                                          "before the other arm was released")
    unsettled: dict[str, int] = Field(default_factory=dict, description="per arm, steps after which it was still "
                                      f"running when the other arm was released ({SETTLE_CAP_S * 1e3:g} ms cap): "
                                      "the round is dropped")
    waiting_cpu_ms: dict[str, list[float]] = Field(
        default_factory=dict, description="per arm, the CPU time it used while waiting at its gate, one value per "
                                          "step of the other arm")
    busy_waiting: dict[str, int] = Field(
        default_factory=dict, description="per arm, steps of the other arm during which it used more CPU than "
                                          "waiting allows (module doc): the round is dropped")

    @property
    def problem(self) -> str | None:
        """Why this lockstep run cannot be used as a pair, or None."""
        bad = [f"{arm} run {r.status}: {(r.error or '')[:300]}" for arm, r in self.results.items() if r.status != "ok"]
        bad += [f"{arm} measured steps {steps[:5]} ran beside the other arm" for arm, steps in self.overlapped.items()
                if steps]
        # an arm still running while the other is measured slows it: a candidate's busy thread would make the
        # incumbent look slow, so such a round is no pair (the run can be timed with --timing pairs)
        bad += [f"{arm} was still running after {n} of its steps when the other arm was released"
                for arm, n in self.unsettled.items() if n]
        bad += [f"{arm} used CPU while waiting at its gate during {n} of the other arm's steps (up to "
                f"{max(self.waiting_cpu_ms.get(arm) or [0]):.1f} ms)" for arm, n in self.busy_waiting.items() if n]
        return "; ".join(bad) or None


class _Turns:
    """Decides, on each child's boundary message, which child steps next (module doc).

    The boundary readers only record a message and wake the releaser thread: a reader must
    never wait (the next message it reads is stamped when read, so a reader held up would
    stretch that arm's step). The releaser waits for the arm that ended a step to be
    quiescent, then lets the next arm step.
    """

    def __init__(self, order: list[str], total_steps: dict[str, int],
                 pid_of: Callable[[str], int | None] = lambda name: None):
        self.order = order
        self.pid_of = pid_of
        self.settle_ms: dict[str, list[float]] = {n: [] for n in order}
        self.unsettled: dict[str, int] = {n: 0 for n in order}
        self.waiting_cpu_ms: dict[str, list[float]] = {n: [] for n in order}
        self.busy_waiting: dict[str, int] = {n: 0 for n in order}
        # the arm last released, when, and the waiting arms' CPU time then
        self.watch: tuple[str, float, dict[str, CpuTime]] | None = None
        self.total_steps = total_steps
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.pending = False  # a message came: a release may be due
        self.to_settle: list[str] = []  # arms that ended a step and wait at their gate
        self.stopped = False
        self.running = {n: True for n in order}  # start-up counts as running
        self.done = {n: 0 for n in order}
        self.ended: set[str] = set()
        self.gates: dict[str, int] = {}
        self.released: dict[str, set[int]] = {n: set() for n in order}
        self.thread = threading.Thread(target=self._releaser, name="lockstep-releaser", daemon=True)

    def on_message(self, name: str, kind: bytes, index: int) -> None:
        with self.lock:
            if kind == b"E":
                self.running[name], self.done[name] = False, index
                if index >= self.total_steps[name]:  # its last step: it ends now, waiting for nothing
                    self.ended.add(name)
                self.to_settle.append(name)
            elif kind == b"L":  # a late-closed first step: the next one is already running
                self.done[name] = index
            elif kind == b"":
                self.running[name] = False
                self.ended.add(name)
            else:
                return
            self.pending = True
            self.wake.notify()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self.wake.notify()
        self.thread.join(timeout=SETTLE_CAP_S * 4 + 1)

    def _releaser(self) -> None:
        while True:
            with self.lock:
                while not (self.pending or self.stopped):
                    self.wake.wait()
                if self.stopped:
                    return
                settle, self.to_settle = self.to_settle, []
                if not settle:  # every arm that stopped has been waited out: release
                    self.pending = False
                    self._release()
                    continue
            for name in settle:  # outside the lock: the readers go on reading meanwhile
                self._settle(name)

    def _settle(self, name: str) -> None:
        """Check what the waiting arms did during this arm's step, then wait (bounded) until this arm
        has stopped running, or for its exit after its last step (module doc)."""
        self._check_waiting(name)
        pid = self.pid_of(name)
        if pid is None:
            return
        if name in self.ended:  # its teardown is not a step's aftermath: not a settle time
            self.unsettled[name] += not wait_exited(pid, cap_s=END_CAP_S).settled
            return
        q = wait_quiescent(pid, cap_s=SETTLE_CAP_S)
        if q.readable:
            self.settle_ms[name].append(round(q.waited_ms, 3))
            self.unsettled[name] += not q.settled

    def _check_waiting(self, measured: str) -> None:
        if self.watch is None or self.watch[0] != measured:
            return
        _, released_at, before = self.watch
        self.watch = None
        step_ms = (time.monotonic() - released_at) * 1e3
        for arm, then in before.items():
            pid = self.pid_of(arm)
            now = cpu_time(pid) if pid is not None else None
            if now is None:
                continue
            busy = now.busy_ms_since(then)
            self.waiting_cpu_ms[arm].append(round(busy, 3))
            self.busy_waiting[arm] += busy > BUSY_WAITING_MS + BUSY_WAITING_REL * step_ms

    def _release(self) -> None:
        live = [n for n in self.order if n not in self.ended]
        if not live or any(self.running[n] for n in live):
            return
        nxt = min(live, key=lambda n: (self.done[n], self.order.index(n)))
        before = {}
        for arm in live:
            pid = self.pid_of(arm) if arm != nxt else None
            if pid is not None and (t := cpu_time(pid)) is not None:
                before[arm] = t
        self.watch = (nxt, time.monotonic(), before)
        try:
            os.write(self.gates[nxt], b"g")
        except OSError:  # it ended between its last message and now
            self.ended.add(nxt)
            self._release()
            return
        self.running[nxt] = True
        self.released[nxt].add(self.done[nxt] + 1)


def run_lockstep(arms: dict[str, PreparedRun], order: list[str]) -> LockstepResult:
    """Run the arms' children together, one step at a time each, in `order` at every tie."""
    if sorted(arms) != sorted(order) or len(order) < 2:
        raise ValueError(f"lockstep needs two or more arms, each once in order: {order} vs {sorted(arms)}")
    children: dict[str, ChildRun] = {}

    def pid_of(name: str) -> int | None:
        child = children.get(name)
        return child.proc.pid if child is not None and child.proc is not None else None

    turns = _Turns(order, {n: p.request.total_steps for n, p in arms.items()}, pid_of)
    gate_reads: list[int] = []
    turns.start()
    try:
        for name in order:
            p = arms[name]
            read_fd, turns.gates[name] = os.pipe()
            gate_reads.append(read_fd)
            children[name] = ChildRun(p.request, env=p.env, max_file_mb=p.max_file_mb, gate_fd=read_fd,
                                      on_boundary=lambda kind, index, name=name: turns.on_message(name, kind, index))
        for child in children.values():
            child.start()
        for fd in gate_reads:  # the children hold their own copies
            os.close(fd)
        gate_reads = []
        with prompt_stamps():
            while any(c.proc.poll() is None for c in children.values()):
                time.sleep(_POLL_S)
                for c in children.values():
                    if c.proc.poll() is not None and c.boundaries.is_reading():
                        c.end()  # what it forked may hold its pipe open: the other arm must not wait on it
                if any(c.proc.poll() is None and c.check_limits(arms[n].timeout_s, arms[n].memory_limit_mb)
                       for n, c in children.items()):
                    break  # a pair with a killed arm is no pair: end both
    finally:
        for child in children.values():
            if child.proc is not None:
                child.end()
        turns.stop()  # before the gates close: a closed descriptor's number may be reused
        for fd in gate_reads + list(turns.gates.values()):
            try:
                os.close(fd)
            except OSError:
                pass
    results = {n: c.finish(arms[n].timeout_s, arms[n].memory_limit_mb) for n, c in children.items()}
    overlapped = {n: [s.index for s in r.steps if s.phase == "measured" and s.index not in turns.released[n]]
                  for n, r in results.items()}
    return LockstepResult(results=results, order=order, overlapped=overlapped, settle_ms=turns.settle_ms,
                          unsettled=turns.unsettled, waiting_cpu_ms=turns.waiting_cpu_ms,
                          busy_waiting=turns.busy_waiting)
