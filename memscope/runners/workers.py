"""DataLoader workers' host memory, sampled from outside by the ``attach`` supervisor.

Nothing is injected into the workers: every ``INTERVAL_S`` the supervisor's wait loop reads, with
psutil (``/proc``), the unique and proportional set sizes (USS, PSS) of each child process of a
recorded training process that is not itself recorded and runs the same program (a forked
DataLoader worker has its parent's command line; a ``spawn``-started one says
``--multiprocessing-fork``). Rows go to ``worker_samples``; ``memscope.analysis.workers`` tells
copy-on-read growth from them. Best effort: a process that vanished, a file that is busy, a
platform without USS are skipped silently (the training's supervision never depends on this).
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

INTERVAL_S = 0.5
MAX_WORKERS = 64  # per sample: a process that forks hundreds of children is not a DataLoader


class WorkerSampler:
    def __init__(self, db: str, interval_s: float = INTERVAL_S) -> None:
        self.db = db
        self.interval_s = interval_s
        self._next = 0.0
        self._conn: sqlite3.Connection | None = None
        self._procs: dict[int, tuple[int, list[str]]] = {}  # pid -> (process id, cmdline)
        self._failed = False
        self.samples = 0

    def tick(self) -> None:
        """Called from the wait loop; samples when one is due. Never raises."""
        if self._failed:
            return
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.interval_s
        try:
            self._sample()
        except Exception:
            pass  # a busy file now is fine later; nothing here may disturb the supervision

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    def _connection(self) -> sqlite3.Connection | None:
        if self._conn is None:
            try:
                from memscope.store.writer import connect_rw

                self._conn = connect_rw(self.db)
            except Exception:
                return None
        return self._conn

    def _sample(self) -> None:
        import psutil

        conn = self._connection()
        if conn is None:
            return
        recorded = {int(pid): int(pid_id) for pid_id, pid in
                    conn.execute("SELECT id, pid FROM processes WHERE status = 'running'")}
        rows: list[tuple[Any, ...]] = []
        t = time.time()
        for pid, proc_id in recorded.items():
            try:
                parent = psutil.Process(pid)
                parent_cmd = parent.cmdline()
                children = parent.children(recursive=False)
            except (psutil.Error, OSError):
                continue
            for child in children[:MAX_WORKERS]:
                if child.pid in recorded:
                    continue
                try:
                    cmd = child.cmdline()
                    if cmd != parent_cmd and not any("multiprocessing" in c for c in cmd):
                        continue  # a program the script ran (a compiler, a shell), not a worker
                    mem = child.memory_full_info()
                except (psutil.Error, OSError):
                    continue
                rows.append((proc_id, child.pid, t, getattr(mem, "uss", None),
                             getattr(mem, "pss", None), mem.rss))
        if not rows:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany("INSERT INTO worker_samples (proc, pid, t, uss, pss, rss) "
                             "VALUES (?, ?, ?, ?, ?, ?)", rows)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.samples += len(rows)
