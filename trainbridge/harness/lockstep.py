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

Whether this resolves smaller effects than process pairs on a given machine is measured,
not assumed: `benchmarks/calibration.py` compares the two.
"""

from __future__ import annotations

import os
import threading
import time

from pydantic import BaseModel, Field

from .models import RunResult
from .runner import _POLL_S, ChildRun, PreparedRun


class LockstepResult(BaseModel):
    results: dict[str, RunResult]
    order: list[str] = Field(..., description="who ran first whenever both had finished the same number of steps")
    overlapped: dict[str, list[int]] = Field(default_factory=dict, description="per arm, measured steps that did "
                                             "not start by a release (they may have run beside the other arm)")

    @property
    def problem(self) -> str | None:
        """Why this lockstep run cannot be used as a pair, or None."""
        bad = [f"{arm} run {r.status}: {(r.error or '')[:300]}" for arm, r in self.results.items() if r.status != "ok"]
        bad += [f"{arm} measured steps {steps[:5]} ran beside the other arm" for arm, steps in self.overlapped.items()
                if steps]
        return "; ".join(bad) or None


class _Turns:
    """Decides, on each child's boundary message, which child steps next (module doc)."""

    def __init__(self, order: list[str], total_steps: dict[str, int]):
        self.order = order
        self.total_steps = total_steps
        self.lock = threading.Lock()
        self.running = {n: True for n in order}  # start-up counts as running
        self.done = {n: 0 for n in order}
        self.ended: set[str] = set()
        self.gates: dict[str, int] = {}
        self.released: dict[str, set[int]] = {n: set() for n in order}

    def on_message(self, name: str, kind: bytes, index: int) -> None:
        with self.lock:
            if kind == b"E":
                self.running[name], self.done[name] = False, index
                if index >= self.total_steps[name]:  # its last step: it stops now, waiting for nothing
                    self.ended.add(name)
            elif kind == b"L":  # a late-closed first step: the next one is already running
                self.done[name] = index
            elif kind == b"":
                self.running[name] = False
                self.ended.add(name)
            else:
                return
            self._release()

    def _release(self) -> None:
        live = [n for n in self.order if n not in self.ended]
        if not live or any(self.running[n] for n in live):
            return
        nxt = min(live, key=lambda n: (self.done[n], self.order.index(n)))
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
    turns = _Turns(order, {n: p.request.total_steps for n, p in arms.items()})
    children: dict[str, ChildRun] = {}
    gate_reads: list[int] = []
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
        for fd in gate_reads + list(turns.gates.values()):
            try:
                os.close(fd)
            except OSError:
                pass
    results = {n: c.finish(arms[n].timeout_s, arms[n].memory_limit_mb) for n, c in children.items()}
    overlapped = {n: [s.index for s in r.steps if s.phase == "measured" and s.index not in turns.released[n]]
                  for n, r in results.items()}
    return LockstepResult(results=results, order=order, overlapped=overlapped)
