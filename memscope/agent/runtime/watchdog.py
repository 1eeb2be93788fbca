"""The agent's watch on ``memscope attach``: a training must not outlive its supervisor.

The supervisor's direct child gets ``PR_SET_PDEATHSIG`` from the kernel; this thread covers every
instrumented process below it as well (a script started through ``bash run.sh``, torchrun's
workers), and on any system: about once a second it checks that the supervisor's pid still names
the process it named at start. When it is gone (SIGKILLed, say) nobody is left to record how the
run ended, so the agent says why in the run file, flushes, and ends its own process.
"""

from __future__ import annotations

import threading
from typing import Callable

import psutil

from memscope.quiet_thread import QuietThread


class SupervisorWatch:
    def __init__(self, pid: int, on_gone: Callable[[int], None], interval: float = 1.0) -> None:
        self.pid = pid
        self._on_gone = on_gone
        self._interval = interval
        self._stop = threading.Event()
        self._born: float | None = None
        self._thread = QuietThread(target=self._run, name="memscope-watchdog")

    def start(self) -> None:
        try:
            self._born = psutil.Process(self.pid).create_time()
        except psutil.Error:
            self._born = None  # already gone: the first check says so
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def alive(self) -> bool:
        if self._born is None:
            return False
        try:
            proc = psutil.Process(self.pid)
            return proc.create_time() == self._born and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.Error:
            return True  # cannot look: assume it is there

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                gone = not self.alive()
            except Exception:  # noqa: BLE001 - a watch that cannot look stops watching
                return
            if gone:
                self._on_gone(self.pid)
                return
