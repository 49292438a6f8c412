"""Quiescence: a process counts as stopped only when none of its threads has run for a while."""

import os
import subprocess
import sys

import pytest

import time

from trainbridge.harness.quiescence import cpu_time, running_threads, wait_exited, wait_quiescent

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


def test_cpu_time_counts_a_thread_that_ran_and_ended_between_two_readings():
    """A waiting arm's CPU time is read before and after the other arm's step: a thread that
    wakes, burns and ends in between is gone from the per-thread sum, and must still count."""
    proc = subprocess.Popen([sys.executable, "-c", """
import sys, threading, time
def burn():
    t = time.monotonic()
    while time.monotonic() - t < 0.15:
        pass
print('ready', flush=True)
sys.stdin.readline()
threading.Thread(target=burn).start()
print('started', flush=True)
time.sleep(30)
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(0.1)
        before = cpu_time(proc.pid)
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"started\n"
        time.sleep(0.4)  # the thread has burnt 150 ms and ended
        after = cpu_time(proc.pid)
        idle = cpu_time(proc.pid)
        assert after.busy_ms_since(before) >= 100, (before, after)
        assert idle.busy_ms_since(after) < 5, (after, idle)
    finally:
        proc.kill()
        proc.wait()


def test_an_ended_process_is_waited_out_to_its_exit():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    try:
        assert not wait_exited(proc.pid, cap_s=0.05).settled
        q = wait_exited(proc.pid, cap_s=5)
        assert q.settled and proc.poll() is not None, q
    finally:
        proc.kill()
        proc.wait()
