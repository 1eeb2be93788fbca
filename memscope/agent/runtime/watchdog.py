"""The agent's watch on ``memscope attach``: a training must not outlive its supervisor.

The supervisor's direct child gets ``PR_SET_PDEATHSIG`` from the kernel; this thread covers every
instrumented process below it as well (a script started through ``bash run.sh``, torchrun's
workers), and on any system: about once a second (a job of the agent's one thread, not a thread of
its own: see :mod:`memscope.turns`) it checks that the supervisor's pid
still names the process it named at start. When it is gone (SIGKILLed, say) nobody is left to record how the
run ended, so the agent says why in the run file, flushes, and ends its own process.

On Linux the look is one read of ``/proc/<pid>/stat`` (its start time and state); psutil only
elsewhere, imported then: importing it costs every attached process ~10 ms at start.
"""

from __future__ import annotations

import os
from typing import Callable

_GONE = object()  # no such process


def _proc_stat(pid: int) -> tuple[str, str] | object | None:
    """(start time in clock ticks since boot, state letter) from /proc, ``_GONE`` when the pid
    names no process, None when there is no /proc to read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except FileNotFoundError:
        return _GONE if os.path.isdir("/proc/self") else None
    except ProcessLookupError:
        return _GONE
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the name in parentheses may hold anything
    if len(fields) < 20:
        return None
    return fields[19], fields[0]  # stat's fields 22 (starttime) and 3 (state)


class SupervisorWatch:
    def __init__(self, pid: int, on_gone: Callable[[int], None], interval: float = 1.0) -> None:
        self.pid = pid
        self.interval = interval
        self._on_gone = on_gone
        self._stopped = False
        self._born: object = None
        self._proc = True  # /proc answers; else psutil

    def start(self) -> None:
        """Note the supervisor's start time; :meth:`check` compares against it."""
        got = _proc_stat(self.pid)
        if got is _GONE:
            self._born = None  # already gone: the first check says so
        elif isinstance(got, tuple):
            self._born = got[0]
        else:
            self._proc = False
            import psutil

            try:
                self._born = psutil.Process(self.pid).create_time()
            except psutil.Error:
                self._born = None

    def stop(self) -> None:
        self._stopped = True

    def alive(self) -> bool:
        if self._born is None:
            return False
        if self._proc:
            got = _proc_stat(self.pid)
            if got is _GONE:
                return False
            if isinstance(got, tuple):
                return got[0] == self._born and got[1] != "Z"
            return True  # cannot look: assume it is there
        import psutil

        try:
            proc = psutil.Process(self.pid)
            return proc.create_time() == self._born and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.Error:
            return True

    def check(self) -> bool:
        """One look; False once there is nothing more to watch (stopped, or the supervisor gone).
        A look that raises stops the watch (the thread drops a job that raises)."""
        if self._stopped:
            return False
        if self.alive():
            return True
        self._on_gone(self.pid)
        return False
