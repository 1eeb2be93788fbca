"""DataLoader workers' host memory, sampled from outside by the ``attach`` supervisor.

Nothing is injected into the workers: every ``INTERVAL_S`` the supervisor's wait loop reads, with
psutil (``/proc``), the unique and proportional set sizes (USS, PSS) of the workers among the
training command's descendants. A worker is a process forked from another without a new program
(same command line as its parent: a DataLoader worker with the default ``fork``) or started by
multiprocessing (``--multiprocessing-fork`` in its command line); a compiler or shell the script
runs is not. Rows go to ``worker_samples``, under the recorded process that is the worker's
parent; ``memscope.analysis.workers`` tells copy-on-read growth from them.

The run file is touched only when there are workers to record (most runs never open it here), and
then with a plain connection and the busy timeout: never a schema change or a journal-mode switch
that could race the agent opening the file. Best effort: a process that vanished, a busy file, a
platform without USS are skipped silently; the training's supervision never depends on this.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

INTERVAL_S = 0.5
MAX_WORKERS = 64  # per sample: a process that forks hundreds of children is not a DataLoader
BUSY_TIMEOUT_S = 5.0


class WorkerSampler:
    def __init__(self, db: str, interval_s: float = INTERVAL_S) -> None:
        self.db = db
        self.interval_s = interval_s
        self._next = 0.0
        self._conn: sqlite3.Connection | None = None
        self._proc_ids: dict[int, int] = {}  # pid of a recorded process -> its processes.id
        self.samples = 0
        self._file = _identity(db)  # the run file as created: never write into a replacement

    def tick(self, root_pid: int) -> None:
        """Called from the wait loop with the training command's pid; samples when one is due.
        Never raises."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.interval_s
        try:
            self._sample(root_pid)
        except Exception:
            pass  # a busy file now is fine later; nothing here may disturb the supervision

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    def _sample(self, root_pid: int) -> None:
        import psutil

        try:
            root = psutil.Process(root_pid)
            procs = [root, *root.children(recursive=True)]
        except (psutil.Error, OSError):
            return
        by_pid = {p.pid: p for p in procs}
        cmdlines: dict[int, list[str]] = {}

        def cmdline(p: Any) -> list[str]:
            if p.pid not in cmdlines:
                cmdlines[p.pid] = p.cmdline()
            return cmdlines[p.pid]

        found: list[tuple[int, int, Any]] = []  # parent pid, worker pid, memory
        for p in procs[1:]:
            if len(found) >= MAX_WORKERS:
                break
            try:
                parent = by_pid.get(p.ppid())
                if parent is None:
                    continue
                cmd = cmdline(p)
                if cmd != cmdline(parent) and not any("multiprocessing" in c for c in cmd):
                    continue
                found.append((parent.pid, p.pid, p.memory_full_info()))
            except (psutil.Error, OSError):
                continue
        if found:
            self._write(found)

    def _write(self, found: list[tuple[int, int, Any]]) -> None:
        if self._file is None or _identity(self.db) != self._file:
            self._file = None  # replaced or deleted: stop for good (the agent says why)
            self.close()
            return
        if self._conn is None:
            self._conn = sqlite3.connect(self.db, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn = self._conn
        missing = {ppid for ppid, _, _ in found if ppid not in self._proc_ids}
        if missing:
            for pid_id, pid in conn.execute("SELECT id, pid FROM processes"):
                self._proc_ids[int(pid)] = int(pid_id)
        t = time.time()
        rows = [(self._proc_ids[ppid], pid, t, getattr(mem, "uss", None), getattr(mem, "pss", None),
                 mem.rss) for ppid, pid, mem in found if ppid in self._proc_ids]
        if not rows:
            return  # workers of a process that is not recorded (a launcher)
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany("INSERT INTO worker_samples (proc, pid, t, uss, pss, rss) "
                             "VALUES (?, ?, ?, ?, ?, ?)", rows)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.samples += len(rows)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
