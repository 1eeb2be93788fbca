"""The agent's watch on ``memscope attach``: a training must not outlive its supervisor.

The supervisor's direct child gets ``PR_SET_PDEATHSIG`` from the kernel; this thread covers every
instrumented process below it as well (a script started through ``bash run.sh``, torchrun's
workers), and on any system: about once a second (a job of the agent's one thread, not a thread of
its own: see :mod:`memscope.turns`) it checks that the supervisor's pid
still names the process it named at start. When it is gone (SIGKILLed, say) nobody is left to record how the
run ended, so the agent says why in the run file, flushes, and ends its own process.
"""

from __future__ import annotations

from typing import Callable

import psutil


class SupervisorWatch:
    def __init__(self, pid: int, on_gone: Callable[[int], None], interval: float = 1.0) -> None:
        self.pid = pid
        self.interval = interval
        self._on_gone = on_gone
        self._stopped = False
        self._born: float | None = None

    def start(self) -> None:
        """Note the supervisor's start time; :meth:`check` compares against it."""
        try:
            self._born = psutil.Process(self.pid).create_time()
        except psutil.Error:
            self._born = None  # already gone: the first check says so

    def stop(self) -> None:
        self._stopped = True

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

    def check(self) -> bool:
        """One look; False once there is nothing more to watch (stopped, or the supervisor gone).
        A look that raises stops the watch (the thread drops a job that raises)."""
        if self._stopped:
            return False
        if self.alive():
            return True
        self._on_gone(self.pid)
        return False
