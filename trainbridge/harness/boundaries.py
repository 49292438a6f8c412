"""Step boundaries timed by the parent: the measurement a candidate's code cannot reach.

The child runs the candidate's code in its own interpreter, so anything the child measures
can be forged from inside (`time.perf_counter` replaced, the harness's clock reached through
`sys.modules`, the result file rewritten). So the child only *signals* each step boundary:
one small message over a pipe whose read end only the parent holds, and the parent stamps it
with its own monotonic clock. Those stamps are the step times; the child's own clock stays
in each step record as a cross-check, and a disagreement beyond what wake-up latency
explains makes the run untrustworthy (`clock_problem`).

Messages are 5 bytes (kind, step index), below PIPE_BUF so every write is atomic:

- `S` a step starts (the child has synchronized the device and read its clock);
- `T` an optimizer stepped before the first step's optimizer set is known (the first
  step's possible end; the last one counts);
- `E i` step i ended now;
- `L i` step i ended at the last `T` (the first step, closed late), and step i + 1 began there.

The grammar is strict: after `E`, an `S` must come before anything else. Extra messages
written by the program (it found the descriptor) break it and are reported, not averaged.
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator

from pydantic import BaseModel, Field

from .models import StepRecord

FORMAT = "<cI"
SIZE = struct.calcsize(FORMAT)
# The child's clock and the parent's stamps measure the same interval; the parent's adds two
# thread wake-ups. Beyond this, one of them was not measuring the step.
TOLERANCE_MS = 20.0
TOLERANCE_REL = 0.10

_now_ns = time.monotonic_ns  # bound at import, before any program code runs in the parent
# A reader thread woken by a message stamps it only once it holds the GIL; while the parent's main
# thread polls the children (memory of a process tree through psutil) that wait lasts up to one
# switch interval, 5 ms by default: a start stamped that late shortens the step it starts.
STAMP_SWITCH_INTERVAL_S = 0.0005


@contextlib.contextmanager
def prompt_stamps() -> Iterator[None]:
    """While children are timed, the parent's threads hand the GIL over within half a millisecond,
    so a boundary is stamped when it arrives, not when the main thread's poll yields."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, STAMP_SWITCH_INTERVAL_S))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class ParentStep(BaseModel):
    index: int
    step_ms: float = Field(..., description="between the parent's stamps of the step's start and end messages")
    max_ms: float = Field(..., description="the longest the step can have been: from the read before its start "
                                           "message to the read of its end message")
    same_read: bool = Field(False, description="start and end arrived in one read (the step was shorter than the "
                                               "parent's wake-up): the parent bounds it, the child's clock measures")


class BoundaryReader:
    """Reads the child's boundary messages on a thread, stamping each as it arrives."""

    def __init__(self, on_message: Callable[[bytes, int], None] | None = None) -> None:
        """`on_message(kind, index)` is called on the reader thread after each message is stamped
        (the lockstep runner releases the other child when one ends a step)."""
        self.on_message = on_message
        self.read_fd, self.write_fd = os.pipe()
        self.steps: dict[int, ParentStep] = {}
        self.problems: list[str] = []
        self._start_ns: int | None = None
        self._start_floor_ns: int | None = None  # the read before the one that brought the start message
        self._tentative_ns: int | None = None
        self._tentative_floor_ns: int | None = None
        self._previous_read_ns = _now_ns()
        self._expect_start = True
        self._thread = threading.Thread(target=self._read, name="step-boundaries", daemon=True)

    def start(self) -> None:
        """Call after the child was started with `write_fd` passed to it."""
        os.close(self.write_fd)  # the child holds the only write end: EOF when it ends
        self._thread.start()

    def join(self, timeout_s: float = 5.0) -> None:
        self._thread.join(timeout_s)

    def is_reading(self) -> bool:
        """Whether the child's end of the pipe is still open somewhere."""
        return self._thread.is_alive()

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = os.read(self.read_fd, 4096)
                stamp = _now_ns()
                if not chunk:
                    break
                buffer += chunk
                while len(buffer) >= SIZE:
                    kind, index = struct.unpack(FORMAT, buffer[:SIZE])
                    buffer = buffer[SIZE:]
                    self._on_message(kind, index, stamp)
                    if self.on_message is not None:
                        self.on_message(kind, index)
                self._previous_read_ns = stamp
        finally:
            if self.on_message is not None:
                self.on_message(b"", 0)  # the child closed its end: it ended
            os.close(self.read_fd)

    def _problem(self, text: str) -> None:
        if len(self.problems) < 5:
            self.problems.append(text)

    def _record(self, index: int, start_ns: int | None, end_ns: int | None) -> None:
        if start_ns is None or end_ns is None:
            self._problem(f"step {index} ended without a start message")
        elif index in self.steps:
            self._problem(f"step {index} ended twice")
        else:
            floor = self._start_floor_ns if self._start_floor_ns is not None else start_ns
            self.steps[index] = ParentStep(index=index, step_ms=(end_ns - start_ns) / 1e6,
                                           max_ms=(end_ns - floor) / 1e6, same_read=end_ns == start_ns)

    def _on_message(self, kind: bytes, index: int, stamp: int) -> None:
        if kind == b"S":
            if not self._expect_start and self._start_ns is not None:
                self._problem(f"a start message inside a running step (before step {len(self.steps) + 1} ended)")
            self._start_ns, self._start_floor_ns, self._expect_start = stamp, self._previous_read_ns, False
        elif self._expect_start and self._start_ns is not None:
            self._problem(f"message {kind!r} where a step start was due")
        elif kind == b"T":
            self._tentative_ns, self._tentative_floor_ns = stamp, self._previous_read_ns
        elif kind == b"E":
            self._record(index, self._start_ns, stamp)
            self._expect_start = True
        elif kind == b"L":
            self._record(index, self._start_ns, self._tentative_ns)
            # the next step began where this one ended
            self._start_ns, self._start_floor_ns = self._tentative_ns, self._tentative_floor_ns
        else:
            self._problem(f"unknown boundary message {kind!r}")


def apply_parent_clock(steps: list[StepRecord], reader: BoundaryReader, *, complete: bool) -> str | None:
    """Replace each step's time by the parent's; keep the child's as `child_step_ms`.

    Returns why the run's timing cannot be believed, or None. Steps the child recorded but
    the parent never saw end (or, for a `complete` run whose records were all written, the
    other way round) are a problem too: the two must describe the same run.
    """
    problems = list(reader.problems)
    for s in steps:
        parent = reader.steps.get(s.index)
        if parent is None:
            problems.append(f"step {s.index} was never signalled to the parent")
            continue
        s.child_step_ms = s.step_ms
        if parent.same_read:
            # Shorter than the parent can resolve: the child's time stands if the parent's bound allows it.
            if s.child_step_ms > parent.max_ms + TOLERANCE_MS:
                problems.append(f"step {s.index}: the program's clock says {s.child_step_ms:.1f} ms, the parent "
                                f"saw it take at most {parent.max_ms:.1f} ms")
            continue
        s.step_ms = parent.step_ms
        gap = abs(parent.step_ms - s.child_step_ms)
        if gap > TOLERANCE_MS + TOLERANCE_REL * parent.step_ms:
            problems.append(f"step {s.index}: the program's clock says {s.child_step_ms:.1f} ms, the parent's "
                            f"{parent.step_ms:.1f} ms")
    extra = sorted(set(reader.steps) - {s.index for s in steps})
    if extra and complete:
        problems.append(f"the parent saw steps {extra[:5]} end that the run's records do not have")
    if not problems:
        return None
    return "the step clock was tampered with: " + "; ".join(problems[:3])
