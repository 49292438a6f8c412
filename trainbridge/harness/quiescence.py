"""Wait until a process has stopped running: every thread asleep or stopped.

A CPU program's OpenMP worker threads do not sleep the moment a parallel region ends: they
spin, ready for the next region, for a while (libgomp's default spin count is 300,000 pause
instructions, milliseconds on a modern core). In lockstep timing (`lockstep`) the arm that
just ended its step waits at its gate while the other arm steps, and if its workers are
still spinning they take a core from the arm being measured. The arm whose step starts with
single-threaded work (a sleep, Python bookkeeping) hides that spin, the other does not, so
differences between the arms were measured smaller than they are. The lockstep runner
therefore releases the next arm only once the previous one is quiescent, as read from
`/proc/<pid>/task/*/stat`; the wait falls between two measured steps and counts for neither.
"""

from __future__ import annotations

import os
import time

from pydantic import BaseModel, Field

RUNNING_STATES = frozenset("R")  # running or runnable; D (uninterruptible I/O) is not using a core


class Quiescence(BaseModel):
    waited_ms: float = Field(..., description="from the call until every thread was seen asleep (or the cap)")
    settled: bool = Field(..., description="False when the cap ran out with a thread still running")
    readable: bool = Field(True, description="False where /proc cannot say (not Linux, or the process is gone)")


def _thread_states(pid: int) -> list[bytes] | None:
    """The state letter of each of the process's threads; None if /proc cannot say."""
    task_dir = f"/proc/{pid}/task"
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return None
    states = []
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended between the listing and the read
            continue
        # the state follows the command name, which is parenthesised and may itself hold ") "
        states.append(stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3])
    return states


def running_threads(pid: int) -> int | None:
    """How many of the process's threads are running or runnable now; None if /proc cannot say."""
    states = _thread_states(pid)
    return None if states is None else sum(s.decode(errors="replace") in RUNNING_STATES for s in states)


def wait_quiescent(pid: int, *, cap_s: float = 0.1, quiet_s: float = 0.001,
                   poll_s: float = 0.0002) -> Quiescence:
    """Poll until no thread of `pid` has run for `quiet_s` (one reading can fall in the instant a
    lock passes from one thread to the next, both asleep), at most `cap_s` seconds."""
    t0 = time.monotonic()
    quiet_since: float | None = None
    while True:
        n = running_threads(pid)
        now = time.monotonic()
        if n is None:
            return Quiescence(waited_ms=(now - t0) * 1e3, settled=True, readable=False)
        if n:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= quiet_s:
            return Quiescence(waited_ms=(quiet_since - t0) * 1e3, settled=True)
        if now - t0 >= cap_s:
            return Quiescence(waited_ms=(now - t0) * 1e3, settled=False)
        time.sleep(poll_s)


_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 1e7


class CpuTime(BaseModel):
    """A process's CPU time so far, read two ways: per live thread in nanoseconds, and for the whole
    thread group in clock ticks (that one keeps threads that have already ended)."""
    threads_ns: int
    group_ns: int

    def busy_ms_since(self, earlier: "CpuTime") -> float:
        """CPU time used between the two readings. A thread that ran and ended in between is gone
        from the per-thread sum, so the group's coarser figure, less one tick of rounding, also counts."""
        by_threads = (self.threads_ns - earlier.threads_ns) / 1e6
        by_group = (self.group_ns - earlier.group_ns - _TICK_NS) / 1e6
        return max(by_threads, by_group, 0.0)


def cpu_time(pid: int) -> CpuTime | None:
    """`pid`'s CPU time now (`CpuTime`); None if /proc cannot say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    group_ns = int((int(fields[11]) + int(fields[12])) * _TICK_NS)  # utime, stime (fields 14, 15 of stat)
    threads_ns = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                threads_ns += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # ended meanwhile, or no scheduler statistics
            continue
    return CpuTime(threads_ns=threads_ns, group_ns=group_ns)


def wait_exited(pid: int, *, cap_s: float, poll_s: float = 0.002) -> Quiescence:
    """Poll until `pid` has exited (gone, or a zombie not yet reaped), at most `cap_s` seconds.

    An arm that ran its last step tears down (writes its results, ends the interpreter) while
    the other arm would run its own last step; teardown sleeps on I/O often enough to look
    quiescent for a moment, so an ended arm is waited out to its exit."""
    t0 = time.monotonic()
    while True:
        # the main thread of an exiting process is a zombie while its other threads still run
        states = _thread_states(pid)
        gone = states is None or all(state in (b"Z", b"X") for state in states)
        now = time.monotonic()
        if gone:
            return Quiescence(waited_ms=(now - t0) * 1e3, settled=True)
        if now - t0 >= cap_s:
            return Quiescence(waited_ms=(now - t0) * 1e3, settled=False)
        time.sleep(poll_s)
