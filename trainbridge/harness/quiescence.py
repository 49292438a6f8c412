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


def running_threads(pid: int) -> int | None:
    """How many of the process's threads are running or runnable now; None if /proc cannot say."""
    task_dir = f"/proc/{pid}/task"
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return None
    running = 0
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended between the listing and the read
            continue
        # the state follows the command name, which is parenthesised and may itself hold ") "
        state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3].decode(errors="replace")
        running += state in RUNNING_STATES
    return running


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
