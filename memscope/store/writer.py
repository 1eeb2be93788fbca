"""Writing side of a run file: connection set-up and the batching writer thread.

Training code only ever calls ``RunWriter.put``: a non-blocking enqueue that counts a drop
instead of waiting when the queue is full. One background thread drains the queue and commits a
WAL transaction at least every ``flush_interval`` seconds.

This runs inside the training process, so it uses the standard library's sqlite3 only: the
sqlite-utils import (about 0.1 s, numpy and dateutil included) would land on every run's start.
"""

from __future__ import annotations

import functools
import queue
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from memscope.store.schema import migrate

BUSY_TIMEOUT_S = 10.0


def connect_rw(path: str) -> sqlite3.Connection:
    """Open (creating if needed) a run file for writing, migrated to the current schema."""
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                           check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: commits do not fsync, so the training never waits on the disk.
        conn.execute("PRAGMA synchronous=NORMAL")
        migrate(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


def close_for_copy(conn: sqlite3.Connection) -> None:
    """Checkpoint and leave WAL mode so the finished run is one self-contained file.

    Only succeeds when no other connection holds the file; a live run stays in WAL.
    """
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode=DELETE")
    except sqlite3.OperationalError:
        pass


@dataclass
class _Insert:
    table: str
    row: dict[str, Any]


@dataclass
class _Exec:
    sql: str
    params: Sequence[Any]


_STOP = object()


@functools.lru_cache(maxsize=64)
def _insert_sql(table: str, columns: tuple[str, ...]) -> str:
    # Table and column names come from memscope's own code, never from user data.
    return (f"INSERT INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join('?' for _ in columns)})")


class RunWriter:
    """Background writer owning one connection to the run file."""

    def __init__(self, path: str, max_queue: int = 20000, flush_interval: float = 0.25) -> None:
        self.path = path
        self.flush_interval = flush_interval
        self.dropped = 0
        self.written = 0
        self.error: str | None = None  # set when the file cannot be opened at all
        self.last_error: str | None = None  # the latest failed batch, if any
        self._q: queue.Queue[object] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="memscope-writer", daemon=True)
        self._thread.start()

    def insert(self, table: str, row: dict[str, Any]) -> bool:
        """Queue a row; never blocks. Returns False (and counts a drop) when the queue is full."""
        return self._put(_Insert(table, row))

    def execute(self, sql: str, params: Sequence[Any] = ()) -> bool:
        """Queue a statement (an UPDATE, say), applied in order with the inserts."""
        return self._put(_Exec(sql, params))

    def _put(self, item: object) -> bool:
        if self.error is not None:
            self.dropped += 1
            return False
        try:
            self._q.put_nowait(item)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def close(self, timeout: float = 10.0) -> None:
        """Flush what is queued and stop the thread (bounded wait)."""
        if self._thread is None:
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._q.put(_STOP, timeout=0.1)
                break
            except queue.Full:
                if time.monotonic() > deadline or not self._thread.is_alive():
                    break
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self._thread = None

    def _run(self) -> None:
        try:
            conn = connect_rw(self.path)
        except Exception as exc:  # the agent reads .error and disables itself
            self.error = f"cannot open run file: {exc}"
            return
        stopping = False
        while not stopping:
            batch: list[object] = []
            deadline = time.monotonic() + self.flush_interval
            while True:
                remaining = deadline - time.monotonic()
                try:
                    item = self._q.get(timeout=max(remaining, 0.001)) if remaining > 0 else self._q.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)
            if batch:
                try:
                    self._write(conn, batch)
                except Exception as exc:  # disk full, locked for too long: count, keep going
                    self.dropped += len(batch)
                    self.last_error = str(exc)
        conn.close()

    def _write(self, conn: sqlite3.Connection, batch: list[object]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            i = 0
            while i < len(batch):
                item = batch[i]
                if isinstance(item, _Insert):
                    # consecutive rows of one table with the same columns: one executemany
                    cols = tuple(item.row)
                    j = i + 1
                    while j < len(batch):
                        nxt = batch[j]
                        if not (isinstance(nxt, _Insert) and nxt.table == item.table
                                and tuple(nxt.row) == cols):
                            break
                        j += 1
                    conn.executemany(_insert_sql(item.table, cols),
                                     [tuple(b.row.values()) for b in batch[i:j]])  # type: ignore[union-attr]
                    self.written += j - i
                    i = j
                else:
                    assert isinstance(item, _Exec)
                    conn.execute(item.sql, item.params)
                    i += 1
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
