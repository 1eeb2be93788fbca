"""memscope's thread: a small stack without touching the program's own setting, and the agent's
periodic jobs (samples, the writer's turns, the supervisor watch) sharing it (issue #21)."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading

import pytest

from conftest import ROOT
from memscope.agent.collectors.sampler import Sampler
from memscope.quiet_thread import STACK_BYTES
from memscope.turns import TurnThread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pthread_getattr_np is glibc's")


def _own_stack_size() -> int:
    libc = ctypes.CDLL(None)
    libc.pthread_self.restype = ctypes.c_ulong
    attr = ctypes.create_string_buffer(128)  # pthread_attr_t is 56 bytes on x86-64 glibc
    assert libc.pthread_getattr_np(ctypes.c_ulong(libc.pthread_self()), attr) == 0
    size = ctypes.c_size_t()
    libc.pthread_attr_getstacksize(attr, ctypes.byref(size))
    libc.pthread_attr_destroy(attr)
    return size.value


def _stack_of(cls: type[threading.Thread]) -> int:
    seen: list[int] = []
    t = cls(target=lambda: seen.append(_own_stack_size()))
    t.start()
    t.join()
    return seen[0]


def test_quiet_threads_get_a_small_stack_and_the_program_keeps_its_setting() -> None:
    """In a fresh process: glibc reuses the cached stack of a thread that exited when it is big
    enough, so in a process that ran other threads (a pytest worker) a new thread may get one
    larger than it asked for."""
    code = f"""
import sys, threading
sys.path.insert(0, {str(ROOT)!r})
sys.path.insert(0, {str(ROOT / "tests")!r})
from test_quiet_thread_stack import _stack_of
from memscope.quiet_thread import QuietThread
previous = threading.stack_size(4 << 20)
print(_stack_of(QuietThread), threading.stack_size(), _stack_of(threading.Thread))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    quiet, setting, user = (int(x) for x in out.stdout.split())
    user_setting = 4 << 20
    assert quiet == STACK_BYTES < user_setting
    assert setting == user_setting  # put back at once
    # the program's threads are unchanged (glibc may hand one a larger cached stack, never less)
    assert user >= user_setting


def test_a_failing_tick_stops_sampling_but_the_chores_go_on() -> None:
    errors: list[BaseException] = []
    ticks = 0
    looks = 0
    watched_on = threading.Event()

    def tick() -> None:
        nonlocal ticks
        ticks += 1
        raise OSError("no file descriptor left")

    def look() -> bool:  # the supervisor watch: True while there is more to watch
        nonlocal looks
        looks += 1
        if looks == 3:
            watched_on.set()
            return False
        return True

    turns = TurnThread("memscope-test")
    turns.add(Sampler(200.0, tick, errors.append))
    turns.every(0.01, look)
    turns.start()
    assert watched_on.wait(30)
    turns.join(30)  # no job left: the thread ends by itself
    assert not turns.is_alive()
    assert ticks == 1 and len(errors) == 1 and isinstance(errors[0], OSError)
    assert looks == 3
