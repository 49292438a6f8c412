"""Quiescence: a process counts as stopped only when none of its threads has run for a while."""

import os
import subprocess
import sys

import pytest

from trainbridge.harness.quiescence import running_threads, wait_quiescent

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")


def _child(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    return proc


def test_a_process_blocked_in_a_read_is_quiescent_at_once():
    proc = _child("import sys; print('ready', flush=True); sys.stdin.read()")
    try:
        q = wait_quiescent(proc.pid, cap_s=1.0)
        assert q.settled and q.readable and q.waited_ms < 200, q
    finally:
        proc.kill()
        proc.wait()


def test_a_thread_still_spinning_holds_the_wait_until_it_stops():
    proc = _child("""
import threading, time
def spin():
    t = time.monotonic()
    while time.monotonic() - t < 0.3:
        pass
threading.Thread(target=spin).start()
print('ready', flush=True)
time.sleep(30)
""")
    try:
        q = wait_quiescent(proc.pid, cap_s=2.0)
        assert q.settled and 150 < q.waited_ms < 1500, q
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_never_stops_is_reported_unsettled_at_the_cap():
    proc = _child("print('ready', flush=True)\nwhile True:\n    pass")
    try:
        q = wait_quiescent(proc.pid, cap_s=0.1)
        assert not q.settled and q.waited_ms >= 100, q
        assert running_threads(proc.pid) >= 1
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_is_gone_cannot_be_read():
    proc = _child("print('ready', flush=True)")
    proc.wait()
    assert running_threads(proc.pid) is None
    assert not wait_quiescent(proc.pid).readable
