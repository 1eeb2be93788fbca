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
that could race the agent opening the file. Best effort: a process that vanished or a platform
without USS is skipped; a sample that could not be written (a busy file, say) is counted, and at
the end a ``recording_degraded`` event says how many were lost and why. The training's
supervision never depends on this.

A worker copies most of a Python-object dataset in its first epoch, which can last a second or
two: sampled only every ``INTERVAL_S``, a short-lived worker's growth shows as one or two jumps
(not gradual: not reported) or is over before its first sample, worse on a loaded machine. So a
worker is sampled every ``YOUNG_INTERVAL_S`` for its first ``YOUNG_S`` seconds after it was found.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

INTERVAL_S = 0.5
YOUNG_INTERVAL_S = 0.1  # while a worker found less than YOUNG_S ago is alive
YOUNG_S = 3.0
MAX_WORKERS = 64  # per sample: a process that forks hundreds of children is not a DataLoader
BUSY_TIMEOUT_S = 5.0


def _has_children_files() -> bool:
    return os.path.exists(f"/proc/self/task/{os.getpid()}/children")


_CHILDREN_FILES = _has_children_files()


def _descendants(root_pid: int) -> list[int] | None:
    """The pids below ``root_pid``, parents before their children, read from Linux's
    ``/proc/PID/task/TID/children`` (each thread's own children): a few small reads, where
    ``psutil.Process.children`` reads the stat file of every process on the machine (8 ms a call
    on a busy one, twice a second, beside the training). None where the kernel has no such
    files: the caller asks psutil."""
    if not _CHILDREN_FILES:
        return None
    out: list[int] = []
    todo = [root_pid]
    while todo and len(out) < 4 * MAX_WORKERS:
        pid = todo.pop(0)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # ended meanwhile
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue  # the thread ended meanwhile
            out.extend(kids)
            todo.extend(kids)
    return out


class WorkerSampler:
    def __init__(self, db: str, interval_s: float = INTERVAL_S) -> None:
        self.db = db
        self.interval_s = interval_s
        self._next = 0.0
        self._conn: sqlite3.Connection | None = None
        self._proc_ids: dict[int, int] = {}  # pid of a recorded process -> its processes.id
        self._found_at: dict[int, float] = {}  # worker pid -> when it was first sampled
        self._young_until = 0.0
        self.samples = 0
        self._file = _identity(db)  # the run file as created: never write into a replacement
        self.lost: dict[str, int] = {}  # why -> samples not written

    def tick(self, root_pid: int) -> float:
        """Called from the wait loop with the training command's pid; samples when one is due.
        Returns the seconds until the next is due (the loop's longest wait). Never raises."""
        now = time.monotonic()
        if now >= self._next:
            young = now < self._young_until
            self._next = now + (YOUNG_INTERVAL_S if young else self.interval_s)
            try:
                self._sample(root_pid)
            except Exception as exc:  # a busy file now is fine later; never disturb the supervision
                why = f"{type(exc).__name__}: {exc}"[:200]
                self.lost[why] = self.lost.get(why, 0) + 1
            if time.monotonic() < self._young_until and not young:
                self._next = min(self._next, now + YOUNG_INTERVAL_S)
        return max(0.0, self._next - time.monotonic())

    def close(self) -> None:
        if self.lost:
            self._report_lost()
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    def _report_lost(self) -> None:
        """A ``recording_degraded`` event: how many worker samples were lost, and why."""
        import json

        n = sum(self.lost.values())
        why = max(self.lost, key=lambda k: self.lost[k])
        message = f"recording degraded: {n} DataLoader-worker sample(s) not written ({why})"
        try:
            conn = self._conn or sqlite3.connect(self.db, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            self._conn = conn
            conn.execute("INSERT INTO events (proc, t, step, kind, message, data) VALUES (?, ?, ?, ?, ?, ?)",
                         (None, time.time(), None, "recording_degraded", message,
                          json.dumps({"source": "worker_samples", "lost": n, "reasons": self.lost})))
        except sqlite3.Error:
            pass  # the file itself is unwritable: the agent's own events say so

    def _sample(self, root_pid: int) -> None:
        import psutil

        try:
            pids = _descendants(root_pid)
            if pids == []:
                return  # no workers (most runs): nothing more to read
            root = psutil.Process(root_pid)
            if pids is None:
                procs = [root, *root.children(recursive=True)]
            else:
                procs = [root]
                for pid in pids:
                    try:
                        procs.append(psutil.Process(pid))
                    except psutil.Error:
                        continue  # ended since it was listed
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
            now = time.monotonic()
            for _, pid, _ in found:
                if pid not in self._found_at:
                    self._found_at[pid] = now
                    self._young_until = max(self._young_until, now + YOUNG_S)
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
