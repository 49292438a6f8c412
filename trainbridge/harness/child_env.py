"""What a harness child inherits, and what it cannot take with it.

A candidate program is untrusted code (docs/measurement_integrity.md). The child gets the
parent's environment minus anything that looks like a credential (an LLM endpoint's key must
never reach a program the model wrote), no core dumps, a cap on the size of any file it
writes (a print flood or a runaway checkpoint ends the run instead of filling the disk),
and, for a non-root user, a cap on how many processes it may start. It runs in its own
process group, and `end_process_tree` ends that group and every descendant still attached
to it on every exit path of the parent, Ctrl-C included. A parent that is killed outright
(`kill -9`, a crash) runs no exit path: the kernel ends the child then (`die_with_parent`).
"""

from __future__ import annotations

import ctypes
import os
import re
import resource
import signal
from collections.abc import Mapping

SECRET_NAME = re.compile(
    r"(^|_)(API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(_|$)|^(OPENAI|ANTHROPIC|AZURE_OPENAI)_", re.I)
"""Variable names a child never sees: *_KEY, *_TOKEN, *_SECRET, passwords, OPENAI_* ..."""

MAX_FILE_MB = 8192
"""Largest file a child may write (stdout and stderr included): RLIMIT_FSIZE."""

NPROC_HEADROOM = 4096
"""Processes and threads a non-root child's user may add to what it runs already (RLIMIT_NPROC;
root ignores that limit, so a fork bomb is only bounded by the time-out there)."""

CAPTURE_BYTES = 16 * 2**20
"""How much of a child's stdout the parent reads back (its last bytes), whatever it printed."""


def child_environment(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """`base` without credentials, then `extra` (what the harness itself sets) on top."""
    env = {k: v for k, v in base.items() if not SECRET_NAME.search(k)}
    env.update(extra)
    return env


def withheld_names(base: Mapping[str, str]) -> list[str]:
    return sorted(k for k in base if SECRET_NAME.search(k))


def _user_tasks() -> int:
    """Threads of this user now (RLIMIT_NPROC counts threads, not only processes)."""
    uid, n = os.getuid(), 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                continue
    return n


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """In the child, between fork and exec: the kernel sends it SIGKILL when the thread that
    started it dies (the harness starts children from the thread that waits for them), so a
    `kill -9`ed or crashed trainbridge leaves no child measuring on. A parent already dead by
    now is caught by the parent id check. No-op where prctl does not exist (not Linux)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def limit_child(max_file_mb: float = MAX_FILE_MB, parent_pid: int | None = None) -> None:
    """Resource limits for the child, set in it between fork and exec (Popen's preexec_fn);
    with `parent_pid`, the child also dies with that parent (`die_with_parent`)."""
    if parent_pid is not None:
        die_with_parent(parent_pid)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    size = int(max_file_mb * 2**20)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size if hard == resource.RLIM_INFINITY else min(size, hard),) * 2)
    if os.getuid() != 0:
        cap = _user_tasks() + NPROC_HEADROOM
        _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        resource.setrlimit(resource.RLIMIT_NPROC, (cap if hard == resource.RLIM_INFINITY else min(cap, hard),) * 2)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(c) for c in f.read().split()]
                out += kids
                todo += kids
        except (OSError, ValueError):
            continue
    return out


def end_descendants(pid: int) -> None:
    """SIGKILL every live descendant of `pid`, in its process group or not (setsid)."""
    for p in _descendants(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def end_process_tree(pid: int) -> None:
    """SIGKILL the child's process group, and its descendants while it still lives to name them.

    The child itself ends its descendants before it exits normally (`harness.child`); a
    process that left the group and was orphaned before that is out of reach here."""
    end_descendants(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_tail(path, limit: int = CAPTURE_BYTES) -> str:
    """The last `limit` bytes of a file, decoded; the file may be any size."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
