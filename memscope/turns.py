"""memscope's one thread in a process: periodic jobs taken in turn, each when it is due (floor:
imports nothing of memscope but :mod:`memscope.quiet_thread`).

Every thread a process starts costs it address space: its stack and, under glibc, a malloc arena
of its own (a 64 MiB reservation) as soon as it allocates. A training under ``ulimit -v`` may
need those megabytes, so the agent's periodic work (memory samples, the run file's writes, the
supervisor watch) shares this one thread rather than start one each.

The price is that no job may block for long: a job that waits delays the others. The writer
therefore waits out a locked run file in short tries, one per turn, never in one long wait.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from memscope.quiet_thread import QuietThread

# a job returns the seconds until its next turn (counted from when this turn was due, so a
# steady job keeps its cadence), or None when it has nothing more to do
Job = Callable[[], Optional[float]]


class _Entry:
    __slots__ = ("job", "due", "hurried")

    def __init__(self, job: Job, due: float) -> None:
        self.job = job
        self.due = due
        self.hurried = False  # asked for a turn now, maybe while it was running


class TurnThread:
    """One :class:`~memscope.quiet_thread.QuietThread` running jobs in turn. It ends by itself
    once no job is left; a job that raises is dropped (the others go on)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._entries: list[_Entry] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: QuietThread | None = None

    def add(self, job: Job, first_in: float = 0.0) -> None:
        """Run ``job`` in ``first_in`` seconds, then as often as it asks."""
        with self._lock:
            self._entries.append(_Entry(job, time.monotonic() + first_in))
        self._wake.set()

    def every(self, interval: float, chore: Callable[[], bool]) -> None:
        """Run ``chore`` about every ``interval`` seconds until it returns False."""
        self.add(lambda: interval if chore() else None, interval)

    def hurry(self, job: Job) -> None:
        """Give ``job`` its next turn now (the writer told to close, say)."""
        with self._lock:
            for entry in self._entries:
                if entry.job == job:  # a bound method is a new object each time it is read: equal, not identical
                    entry.due = time.monotonic()
                    entry.hurried = True
        self._wake.set()

    def start(self) -> None:
        self._thread = QuietThread(target=self._run, name=self.name)
        self._thread.start()

    def on_thread(self) -> bool:
        """Whether the caller is this thread (a job that must not wait for itself)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None and not self.on_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._entries:
                    return
                entry = min(self._entries, key=lambda e: e.due)
            wait = entry.due - time.monotonic()
            if wait > 0:
                self._wake.wait(wait)  # a new job, or one hurried, may be due sooner
                self._wake.clear()
                continue
            entry.hurried = False
            try:
                delay = entry.job()
            except Exception:  # noqa: BLE001 - a failing job is dropped, never raised into the process
                delay = None
            with self._lock:
                if delay is None:
                    self._entries.remove(entry)
                elif entry.hurried:
                    entry.due = time.monotonic()
                else:
                    # on cadence; a turn that ran late is not made up by a burst
                    entry.due = max(entry.due + delay, time.monotonic())
