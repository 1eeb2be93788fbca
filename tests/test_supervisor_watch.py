"""The agent's watch on its supervisor (memscope.agent.runtime.watchdog), on real processes: a
process that runs is alive; one that exited (a zombie not yet reaped, then reaped) is gone; a pid
now naming another process (another start time) is gone; a stopped watch ends."""

from __future__ import annotations

import subprocess
import sys
import time

from memscope.agent.runtime.watchdog import SupervisorWatch


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


def test_a_running_supervisor_is_alive_and_an_exited_one_is_gone() -> None:
    gone: list[int] = []
    proc = _sleeper()
    try:
        watch = SupervisorWatch(proc.pid, gone.append)
        watch.start()
        assert watch.check() and watch.alive()
        proc.kill()
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:  # reaped: no such pid
            time.sleep(0.01)
        assert not watch.alive()
        assert not watch.check() and gone == [proc.pid]
    finally:
        proc.kill()
        proc.wait()


def test_an_unreaped_child_is_gone() -> None:
    proc = _sleeper()
    try:
        watch = SupervisorWatch(proc.pid, lambda pid: None)
        watch.start()
        proc.kill()
        deadline = time.monotonic() + 10
        while watch.alive() and time.monotonic() < deadline:  # a zombie until waited for
            time.sleep(0.01)
        assert not watch.alive()
        assert proc.returncode is None  # not reaped yet: it was seen as a zombie
    finally:
        proc.wait()


def test_the_pid_of_another_process_is_gone() -> None:
    proc = _sleeper()
    try:
        watch = SupervisorWatch(proc.pid, lambda pid: None)
        watch.start()
        assert watch.alive()
        watch._born = "1"  # the start time of the process the pid named before (reused pid)
        assert not watch.alive()
    finally:
        proc.kill()
        proc.wait()


def test_a_stopped_watch_ends_without_calling_back() -> None:
    gone: list[int] = []
    watch = SupervisorWatch(999_999_999, gone.append)  # no such pid
    watch.start()
    watch.stop()
    assert not watch.check() and gone == []
