"""Writing side of a run file: connection set-up and the batching writer.

Training code only ever calls ``RunWriter.insert`` / ``execute``: a non-blocking enqueue. The
writer drains the queue and commits a WAL transaction at least every ``flush_interval`` seconds,
in turns on memscope's one thread (:mod:`memscope.turns`), which the memory samples share: a turn
never waits long. A lock held by another connection is waited out in short tries, a turn each,
for up to the busy timeout; past it the file counts as refusing writes (below).

What may be lost and what may not: the run's structure (steps, events, inventories, layer rows,
OOM records, process status) is never shed. A failed batch is retried; a batch that fails on one
bad row is split until the row is found, and only that row is refused; a batch that cannot be
written at all (disk full, read-only, locked for longer than the busy timeout) keeps its
structure rows for the next attempt and sheds its memory samples. Only samples are bounded by
the queue (the disk is slow: count and move on). Every loss is counted in ``dropped`` and
explained by a ``recording_degraded`` event (the error, from when) as soon as the file takes
writes again; the count is kept current in the process row with the heartbeat.

This runs inside the training process, so it uses the standard library's sqlite3 only: the
sqlite-utils import (about 0.1 s, numpy and dateutil included) would land on every run's start.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from memscope.store import fold, reserve, spill
from memscope.store.closing import ClosingConnection
from memscope.store.schema import SCHEMA_VERSION, RunFileError, expected_tables, migrate
from memscope.turns import TurnThread


def _env_number(name: str, default: float) -> float:
    try:
        value = float(os.environ[name])
    except (KeyError, ValueError):
        return default
    return value if value > 0 else default


# How long one transaction waits for another connection's lock before the writer calls the
# file refusing (MEMSCOPE_BUSY_TIMEOUT: the tests make it short). Rows are not lost when it
# passes: they wait in memory, then in the spill file, for as long as the lock lasts.
BUSY_TIMEOUT_S = _env_number("MEMSCOPE_BUSY_TIMEOUT", 10.0)
DEGRADED_BUSY_S = 0.5  # at close, once refusing: the tries after the window
# The writer shares its thread with the memory samples (memscope/turns.py): a lock is waited
# out in tries this short, one a turn, so a sample is never held up longer than that
TURN_BUSY_S = 0.02
TURN_RETRY_S = 0.05  # between those tries
REPLAY_TURN_S = 0.1  # spill file replayed in slices this long, a turn each, the samples between
# Structure rows kept in memory while the file refuses writes; past this they go to the spill
# file beside the run file (MEMSCOPE_SPILL_AFTER; about 1 KiB of memory each).
SPILL_AFTER = int(_env_number("MEMSCOPE_SPILL_AFTER", 5000))
# Structure rows the training may queue while the writer thread is inside one blocked attempt
# (a guard for the training's memory: beyond it they are counted as lost)
MAX_QUEUED_STRUCTURE = 200_000
HEARTBEAT_S = 1.0  # how often a live writer stamps its process row (and the current drop count)
# Tables whose rows may be shed under back-pressure: periodic readings, not the run's structure.
SAMPLE_TABLES = frozenset({"samples", "cuda_samples", "nvml_samples"})
RETRY_S = (0.05, 0.2, 0.5, 1.0, 2.0)  # waits between attempts while the file refuses writes
DEGRADED_CHUNK = 64  # rows per transaction while the file refuses writes
MAX_REPORTS = 50  # recording_degraded events per run at most (one per distinct reason)


def connect_rw(path: str, busy_timeout: float = BUSY_TIMEOUT_S) -> sqlite3.Connection:
    """Open (creating if needed) a run file for writing, migrated to the current schema."""
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None,
                           check_same_thread=False, factory=ClosingConnection)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        tune(conn)
        migrate(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


WAL_PAGES = 256  # checkpoint the -wal into the file at about 1 MiB (SQLite's default: 4 MiB)


def tune(conn: sqlite3.Connection) -> None:
    """Settings of every writing connection. NORMAL in WAL mode: commits do not fsync, so the
    training never waits on the disk. A small -wal: every commit rewrites the same few leaf
    pages into it, so on a small or nearly full disk a 4 MiB -wal would hold mostly stale
    copies where the rows could be; after each checkpoint it is cut back to that size."""
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
    conn.execute(f"PRAGMA journal_size_limit={WAL_PAGES * 4096}")


def close_for_copy(conn: sqlite3.Connection) -> bool:
    """Checkpoint and leave WAL mode so the finished run is one self-contained file.

    Only succeeds when no other connection holds the file (a live run, a dashboard still open)
    and the disk has room for the checkpoint. Returns whether the file is self-contained now.
    """
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        mode = conn.execute("PRAGMA journal_mode=DELETE").fetchone()
        return bool(mode) and str(mode[0]).lower() == "delete"
    except sqlite3.Error:
        return False


def rollback_quietly(conn: sqlite3.Connection) -> None:
    """Roll back if a transaction is still open: after SQLITE_FULL or an I/O error SQLite may
    have rolled it back itself, and a second ROLLBACK would replace the real error with
    "cannot rollback - no transaction is active"."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


@dataclass
class _Insert:
    table: str
    row: dict[str, Any]

    @property
    def sheddable(self) -> bool:
        return self.table in SAMPLE_TABLES


@dataclass
class _Update:
    """An update of rows of ``table`` where ``key`` matches: never SQL text, so that what the
    spill file keeps is rows (memscope/store/spill.py)."""

    table: str
    key: dict[str, Any]
    values: dict[str, Any]
    meta: bool = False  # the writer's own bookkeeping (heartbeat): never counted as a drop
    sheddable = False

    @property
    def sql(self) -> str:
        return _update_sql(self.table, tuple(self.values), tuple(self.key))

    @property
    def params(self) -> tuple[Any, ...]:
        return (*self.values.values(), *self.key.values())



@functools.lru_cache(maxsize=64)
def _insert_sql(table: str, columns: tuple[str, ...]) -> str:
    # Table and column names come from memscope's own code, never from user data.
    return (f"INSERT INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join('?' for _ in columns)})")


def update_statement(table: str, key: dict[str, Any], values: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """An update of memscope's schema as (SQL, parameters): names checked, values bound."""
    return _update_sql(table, tuple(values), tuple(key)), (*values.values(), *key.values())


@functools.lru_cache(maxsize=64)
def _update_sql(table: str, columns: tuple[str, ...], key: tuple[str, ...]) -> str:
    known = expected_tables(SCHEMA_VERSION).get(table, {})
    if not columns or not set(columns) | set(key) <= set(known):  # memscope's names only
        raise ValueError(f"not an update of memscope's schema: {table} {columns} {key}")
    return (f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in columns)} "
            f"WHERE {' AND '.join(f'{k} = ?' for k in key)}")


class _FileRefused(Exception):
    """The whole file refused the write (full, read-only, locked): no row is to blame."""

    def __init__(self, error: sqlite3.Error) -> None:
        super().__init__(str(error))
        self.error = error


class RunWriter:
    """Background writer owning one connection to the run file.

    ``max_queue`` bounds the samples waiting to be written (the rest are dropped and counted);
    structure rows wait however long the file refuses writes: ``spill_after`` of them in
    memory, the rest in the spill file (:mod:`memscope.store.spill`), replayed in order when
    the file takes writes again. ``max_pending`` guards the training's memory while the writer
    thread is inside one blocked attempt: structure rows queued beyond it are counted as lost.
    Rows that are truly lost (the spill file cannot be written either, the run file was
    replaced or deleted) are counted, steps among them in ``lost_steps``, and explained.

    ``file_id``: the (st_dev, st_ino) the run file must have; the writer stops writing (and
    counts every row after as lost) when the path names another file or none.
    """

    def __init__(self, path: str, max_queue: int = 20000, flush_interval: float = 0.25,
                 max_pending: int | None = None, busy_timeout: float | None = None,
                 on_connect: Callable[[sqlite3.Connection], None] | None = None,
                 spill_after: int | None = None, file_id: tuple[int, int] | None = None,
                 spill_file: spill.SpillFile | None = None) -> None:
        self.path = path
        self.busy_timeout = busy_timeout if busy_timeout is not None else BUSY_TIMEOUT_S
        self.spill_after = spill_after if spill_after is not None else SPILL_AFTER
        # the spill file this process made and the run file records (runs.register_writer);
        # made here, unrecorded, on the first spill of a writer without one (then only this
        # writer replays it: attach's supervisor ignores a file the run does not record)
        self.spill_file = spill_file
        self._spill_recorded = spill_file is not None
        self.file_id = file_id
        self.lost_steps = 0  # steps rows among the structure rows not kept
        self.spilled = 0  # rows that went through the spill file
        self.spill_peak = 0  # the spill file's largest size, bytes
        self.handed_off = 0  # rows left in the spill file at close, for the supervisor to write
        # called with every connection the writer opens (the fault-injection tests use it to
        # make a real connection refuse: PRAGMA query_only, max_page_count)
        self.on_connect = on_connect
        self.flush_interval = flush_interval
        self.max_queue = max_queue
        self.max_pending = max_pending if max_pending is not None else MAX_QUEUED_STRUCTURE
        self.dropped = 0  # rows not kept: samples shed, refused rows, structure past max_pending
        self.dropped_structure = 0  # of which structure rows (should stay 0)
        self.written = 0
        self.error: str | None = None  # set when the file cannot be opened at all
        self.last_error: str | None = None  # the latest write error, if any
        self.degraded_since: float | None = None  # when the current write failures began
        self.proc_id: int | None = None  # set once the process row exists: heartbeat, events
        self.samples: Callable[[], int] | None = None  # the agent's sample count, for the heartbeat
        self._q: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._queued_samples = 0
        self._queued_structure = 0
        self._lock = threading.Lock()  # counters shared by the training and sampler threads
        self._turns: TurnThread | None = None  # the thread the writer takes turns on
        self._done = threading.Event()  # set once the writer wrote its last
        self._closing = False
        self._deadline = 0.0  # monotonic: when close() stops waiting for the file
        self._opened = False
        self._open_tries = 0
        self._busy_since: float | None = None  # monotonic: when the lock being waited out began
        self._pending: list[object] = []  # structure rows a failed attempt kept for the next
        self._conn: sqlite3.Connection | None = None
        self._reported: str | None = None  # the drop reason last written in an event
        self._reports = 0
        self._beating = True  # False once the file turned the heartbeat down (an old schema)
        self._drop_reason: str | None = None  # why the latest rows were dropped
        self._drop_since: float | None = None
        self._beat_at = 0.0
        self._retry = 0
        self._side_ids: dict[str, tuple[int, int]] = {}  # the -wal / -shm beside our file
        self._spill_offset = 0  # bytes of the spill file already replayed into the run file
        self._spill_rows = 0  # rows in the spill file not yet replayed
        # room on the disk for the end of the run (memscope/store/reserve.py): made once the file
        # is open, given back at close (first, on a disk that filled up)
        self._reserve = reserve.Reserve(path)
        self.fold_state: fold.FoldState | None = fold.FoldState()  # None: folding stopped
        self.fold_error: str | None = None  # why folding stopped (a bug: rows stay whole)
        self._fold_at = 0.0

    def start(self, turns: TurnThread | None = None) -> None:
        """Write on ``turns``, the thread the agent shares between its jobs (memory samples,
        the supervisor watch), or on a thread of the writer's own."""
        if turns is None:
            turns = TurnThread("memscope-writer")
            turns.add(self._turn)
            self._turns = turns
            turns.start()
        else:
            self._turns = turns
            turns.add(self._turn)

    def insert(self, table: str, row: dict[str, Any]) -> bool:
        """Queue a row; never blocks. Returns False (and counts a drop) when it cannot be kept."""
        return self._put(_Insert(table, row))

    def update(self, table: str, key: dict[str, Any], values: dict[str, Any]) -> bool:
        """Queue an update of ``table``'s rows matching ``key`` (the process row's device, say),
        applied in order with the inserts."""
        _update_sql(table, tuple(values), tuple(key))  # memscope's names, or ValueError now
        return self._put(_Update(table, key, values))

    def use_spill(self, spill_file: spill.SpillFile | None) -> None:
        """The spill file the run records for this writer (runs.register_writer), before start."""
        self.spill_file = spill_file
        self._spill_recorded = spill_file is not None

    @property
    def spill_path(self) -> str | None:
        return self.spill_file.path if self.spill_file is not None else None

    def _put(self, item: _Insert | _Update) -> bool:
        sheddable = item.sheddable
        with self._lock:
            if self.error is not None:
                self._count_drop(sheddable, self.error, steps=_is_step(item))
                return False
            if sheddable:
                if self._queued_samples >= self.max_queue:
                    self._count_drop(True, "writer queue full (the disk is slower than the samples)")
                    return False
                self._queued_samples += 1
            else:
                if self._queued_structure >= self.max_pending:
                    self._count_drop(False, "writer queue full (the run file has not taken a "
                                            "write for a long time)", steps=_is_step(item))
                    return False
                self._queued_structure += 1
        self._q.put_nowait(item)
        return True

    def count_lost_step(self, reason: str) -> None:
        """A step whose row was never made (its boundary failed): lost, counted, explained."""
        with self._lock:
            self._count_drop(False, reason, 1, 1)

    def _count_drop(self, sheddable: bool, reason: str, n: int = 1, steps: int = 0) -> None:
        self.dropped += n
        self.lost_steps += steps
        if not sheddable:
            self.dropped_structure += n
        if self._drop_reason != reason or self._drop_since is None:
            self._drop_reason = reason
            self._drop_since = time.time()

    def close(self, timeout: float | None = None) -> None:
        """Flush what is queued and stop writing (bounded wait: what the file does not take by
        then is left in the spill file, for attach's supervisor to write). Called on the writer's
        own thread (a job of the agent's), it flushes there and then."""
        turns = self._turns
        if turns is None or self._done.is_set():
            return
        if timeout is None:  # the lock's window, then the short tries and the spill
            timeout = self.busy_timeout + 4 * DEGRADED_BUSY_S + 2.0
        self._deadline = time.monotonic() + timeout
        self._closing = True
        if turns.on_thread() or not turns.is_alive():  # (not started: the agent's start failed)
            self._finish()
            return
        turns.hurry(self._turn)
        self._done.wait(max(0.0, self._deadline - time.monotonic()))

    # -- the writer's turns (on the agent's one thread) ----------------------------------------

    def _turn(self) -> float | None:
        """One turn: open the file or write what is queued, without a long wait (the thread's
        other jobs, the memory samples, wait meanwhile). The seconds until the next turn; None
        once the writer is done."""
        if self._done.is_set():
            return None
        if self._closing:
            self._finish()
            return None
        try:
            if self._conn is None and not self._opened:
                return self._open_turn()
            # while a lock is waited out, the rows a try holds are tried again and the newer
            # ones stay in the queue, under its bounds
            self._attempt([] if self._waiting() and self._pending else self._drain_now(), final=False)
        except Exception:  # noqa: BLE001 - a bug here must not end the recording
            pass
        if self._done.is_set():
            return None
        if self._spill_rows and self.degraded_since is None:
            return 0.0  # replaying the spill file, a slice a turn
        if self._waiting():
            return TURN_RETRY_S
        if self._pending:
            return RETRY_S[min(self._retry, len(RETRY_S) - 1)]
        return self.flush_interval

    def _waiting(self) -> bool:
        """Whether a lock is being waited out (within the busy window, not yet degraded)."""
        return self._busy_since is not None and self.degraded_since is None

    def _waits(self, exc: BaseException | None) -> bool:
        """Whether ``exc`` is a lock to wait out a turn longer: the file was busy, and has been
        for less than the busy timeout (past it, the file is refusing: the rows spill)."""
        if not (isinstance(exc, _FileRefused) and _is_busy(exc.error)) or self.degraded_since is not None:
            return False
        now = time.monotonic()
        if self._busy_since is None:
            self._busy_since = now
        return now - self._busy_since < self.busy_timeout

    def _open_turn(self) -> float | None:
        """One try at opening the run file. A failed open is tried again (a disk that frees
        up); after the last try every row is counted as dropped. A lock held by another process
        is waited out however long it lasts, the rows kept meanwhile as while writing (memory,
        then the spill file)."""
        try:
            self._conn = connect_rw(self.path, self._try_s())
            if self.on_connect is not None:
                self.on_connect(self._conn)
            if self.file_id is None:
                st = os.stat(self.path)
                self.file_id = (st.st_dev, st.st_ino)
        except Exception as exc:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            locked = isinstance(exc, sqlite3.Error) and _is_busy(exc)
            if isinstance(exc, RunFileError) or (not locked and self._open_tries >= len(RETRY_S)):
                with self._lock:  # not a run file, or one that will not open: no point
                    self.error = f"cannot open run file: {exc}"
                    n, steps = self._discard_queue()
                    samples = sum(1 for it in self._pending if getattr(it, "sheddable", False))
                    if samples:
                        self._count_drop(True, self.error, samples)
                    self._count_drop(False, self.error, n + len(self._pending) - samples,
                                     steps + sum(_is_step(it) for it in self._pending))
                    self._pending = []
                self._done.set()
                return None
            if isinstance(exc, sqlite3.Error) and locked and self._waits(_FileRefused(exc)):
                return TURN_RETRY_S
            batch = self._drain_now()
            self._take(batch)
            self._refused(exc, self._pending + batch, since=self._since())
            self._open_tries += 1
            return RETRY_S[min(self._open_tries - 1, len(RETRY_S) - 1)]
        self._opened = True
        self._busy_since = None
        self._reserve.make()
        return 0.0  # what waited: at once

    def _try_s(self) -> float:
        """The busy timeout of one try: short on a turn, so the samples keep their cadence."""
        return min(self.busy_timeout, TURN_BUSY_S)

    def _since(self) -> float:
        """When the current write failures began (wall clock): the start of the lock waited out."""
        if self._busy_since is None:
            return time.time()
        return time.time() - (time.monotonic() - self._busy_since)

    def _finish(self) -> None:
        """At close: the last writes, waiting out a lock until the deadline; what the file did
        not take is left in the spill file for the supervisor (or counted as lost)."""
        self._closing = True
        try:
            if self._conn is None and not self._opened:
                while not self._done.is_set() and not self._opened and time.monotonic() < self._deadline:
                    delay = self._open_turn()
                    if delay is not None and not self._opened:
                        time.sleep(min(delay, max(0.0, self._deadline - time.monotonic())))
                if self._done.is_set():
                    return
                if not self._opened:  # the process ends behind the lock: the supervisor writes the rows
                    batch = self._drain_now()
                    self._take(batch)
                    rows = self._pending + batch
                    self._pending = []
                    self._spill(rows, self.last_error or "locked")
                    self.handed_off = self._spill_rows
                    return
            if self.degraded_since is not None and "full" in (self.last_error or ""):
                self._reserve.release()  # room for what is waiting, within the margin, and the count
            self._attempt(self._drain_now(), final=True)
            while self._waiting() and time.monotonic() < self._deadline:
                time.sleep(TURN_RETRY_S)
                self._attempt(self._drain_now(), final=True)
            if self._waiting():  # the deadline came first: the file refuses, as far as we wait
                self._busy_since = None
                items, self._pending = self._pending, []
                self._refused(_FileRefused(sqlite3.OperationalError("database is locked")), items,
                              since=self._since())
            self._finish_tail()
        finally:
            if not self._spill_recorded:  # made here, unrecorded: no one else would replay it
                self.close_spill()
            if self._conn is not None:
                try:
                    self._conn.close()
                except sqlite3.Error:
                    pass
                self._conn = None
            self._reserve.release()
            self._done.set()

    def _finish_tail(self) -> None:
        if self._pending or self._spill_rows or self._reported != self._drop_reason:
            self._attempt([], final=True)  # last try: the file may have room again
        if not self._pending and not self._spill_rows and self.degraded_since is None:
            self._fold(time.time())  # the steps since the last fold, but for the tail
        if self._pending and "full" in (self.last_error or ""):
            # a full disk: the spill file would only take the room kept for the count and the
            # end of the run (memscope/store/reserve.py); what did not fit is lost, and counted
            rows = [it for it in self._pending if not getattr(it, "meta", False)]
            with self._lock:
                self._count_drop(False, f"{self.last_error}; written up to the room kept for the end "
                                        "of the run", len(rows), sum(_is_step(it) for it in rows))
            self._pending = []
        if self._pending:  # not written: to the spill file for the supervisor, else lost
            self._spill(self._pending, self.last_error or "write failed")
            self._pending = []
        if self._spill_rows:  # why rows were shed meanwhile, written after them
            self._spill(self._report_rows(time.time()), "")
        self.handed_off = self._spill_rows
        if self.dropped_structure and self.error is None:
            self._final_report()

    def _take(self, batch: list[object]) -> None:
        """``batch`` left the queue: its rows no longer count against the queue's bounds."""
        n_samples = sum(1 for it in batch if getattr(it, "sheddable", False))
        with self._lock:
            self._queued_samples -= n_samples
            self._queued_structure -= len(batch) - n_samples

    def _discard_queue(self) -> tuple[int, int]:
        """Empty the queue; the number of rows it held, and of steps rows among them."""
        rows = steps = 0
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return rows, steps
            rows += 1
            steps += _is_step(item)

    def _drain_now(self) -> list[object]:
        batch: list[object] = []
        while True:
            try:
                batch.append(self._q.get_nowait())
            except queue.Empty:
                return batch

    def _attempt(self, batch: list[object], final: bool) -> None:
        """Write the pending structure rows, ``batch``, the drop report and the heartbeat.
        Never raises: the writer thread must outlive any error."""
        self._take(batch)
        items = self._pending + batch
        self._pending = []
        if self.error is not None:  # the run file was replaced or deleted: nothing goes there
            self._lost(items)
            return
        now = time.time()
        report = self._report_rows(now)
        meta: list[object] = []
        if self._beating and (final or now - self._beat_at >= HEARTBEAT_S):
            beat = self._heartbeat_row(now)
            if beat is not None:
                meta.append(beat)
        if not items and not report and not meta and not self._spill_rows:
            return
        if self.degraded_since is not None and self.spill_file is not None:
            self.spill_file.touch()  # a sign of life for readers while the file refuses
        gone = self._file_gone()
        if gone is not None:
            self._file_lost(gone, items)
            return
        try:
            refusal = self._replay_spill(None if final else REPLAY_TURN_S)
            if refusal is not None:
                left = report + meta + items
            elif self._spill_rows:
                # more to replay on the next turns: the new rows go after those, in order
                self._spill(items, "the spill file is being replayed")
                left, refusal = self._write_all(report + meta, [])
            else:
                # the reason and the heartbeat first: when the disk is nearly full, the small
                # transaction that says why may fit where the rows no longer do
                left, refusal = self._write_all(report + meta, items)
        except Exception as exc:  # noqa: BLE001 - a bug here must not end the recording
            left, refusal = report + meta + items, exc
        own = {id(it) for it in report + meta}
        if report and not any(id(it) in own for it in left):  # the event is in the file
            self._reported = self._drop_reason
            self._reports += 1
        if meta and not any(id(it) in own for it in left):
            self._beat_at = now
        if refusal is not None:
            rest = [it for it in left if id(it) not in own]  # the others: made afresh
            if self._waits(refusal):
                self._pending = rest  # a lock within the busy window: a turn later (samples too)
                return
            # the errors began when the lock being waited out did
            self._refused(refusal, rest, since=self._since())
            return
        self._busy_since = None
        if self.degraded_since is not None:
            self._recovered(now)
        elif now - self._fold_at >= fold.FOLD_EVERY_S:
            self._fold(now)

    def _fold(self, now: float) -> None:
        """Fold uneventful steps into windows (memscope/store/fold.py). A refusing file is
        tried again at the next fold; any other error stops folding (the steps stay whole)."""
        self._fold_at = now
        if self.fold_state is None or self.proc_id is None or self._conn is None:
            return
        try:
            fold.fold(self._conn, self.proc_id, self.fold_state)
        except sqlite3.Error:
            self._reconnect()
        except Exception as exc:  # noqa: BLE001 - a bug here must not end the recording
            self.fold_state = None
            self.fold_error = f"{type(exc).__name__}: {exc}"
            self._pending.append(_Insert("events", self._event_row(
                "fold_stopped", f"steps are no longer folded into windows: {self.fold_error}",
                {"error": self.fold_error})))

    def _refused(self, exc: BaseException, items: list[object], since: float | None = None) -> None:
        """The file took none of ``items``: keep the structure for the next attempt, shed the
        samples, and start the next attempt on a fresh connection."""
        error = exc.error if isinstance(exc, _FileRefused) else exc
        message = _describe(error) if isinstance(error, sqlite3.Error) else f"{type(error).__name__}: {error}"
        if self.degraded_since is None:
            self.degraded_since = since if since is not None else time.time()
        self.last_error = message
        conn = self._conn
        if conn is not None and "full" in message:
            try:  # a checkpoint folds the WAL into the file and may free room
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass
        self._reconnect()
        self._retry += 1
        keep = [it for it in items if not getattr(it, "sheddable", False)]
        shed = len(items) - len(keep)
        if shed:
            with self._lock:
                self._count_drop(True, message, shed)
        if self._spill_rows or len(keep) > self.spill_after:
            # in order: the spill file holds the oldest rows, memory the newer ones
            self._spill(keep, message)
            keep = []
        elif self.spill_file is not None:
            self.spill_file.touch()  # the file readers look at for a sign of life meanwhile
        self._pending = keep

    # -- the spill file ------------------------------------------------------------------------

    def _spill(self, items: list[object], why: str) -> None:
        """Append ``items`` to the spill file; rows it cannot take are lost (counted)."""
        lines = [_encode(it) for it in items if not getattr(it, "meta", False)]
        if not lines:
            return
        try:
            sf = self._spill_file()
            sf.append(lines)
        except OSError as exc:
            where = f" {self.spill_path}" if self.spill_path else ""
            with self._lock:
                self._count_drop(False, f"{why}; the spill file{where} could not take "
                                        f"the waiting rows either ({exc.strerror or exc})",
                                 len(lines), sum(_is_step(it) for it in items))
            return
        self._spill_rows += len(lines)
        self.spilled += len(lines)
        self.spill_peak = max(self.spill_peak, sf.size())

    def _spill_file(self) -> spill.SpillFile:
        """This writer's spill file (made now, unrecorded, when it has none: OSError)."""
        if self.spill_file is None:
            self.spill_file = spill.SpillFile.create(self.path, self.proc_id)
        return self.spill_file

    def spill_update(self, table: str, key: dict[str, Any], values: dict[str, Any]) -> bool:
        """After close: leave one update (the process row's last word) in the spill file, for
        the supervisor to write once the file takes writes. Whether it was kept."""
        try:
            self._spill_file().append([spill.encode_update(table, key, values)])
        except (OSError, ValueError):
            return False
        self.handed_off += 1
        return True

    def close_spill(self) -> None:
        """At the end: the spill file goes when no row waits in it for the supervisor."""
        if self.spill_file is not None and not self.handed_off and not self._spill_rows:
            self.spill_file.remove()

    def _replay_spill(self, budget: float | None) -> BaseException | None:
        """Write the spill file's rows, oldest first, in chunks, for about ``budget`` seconds
        (None: all); None when the file took them (it is removed once all are in), else why
        the file refused."""
        if not self._spill_rows or self.spill_file is None:
            return None
        until = None if budget is None else time.monotonic() + budget
        while True:
            refused = spill.Refused()
            try:
                chunk, offset = self.spill_file.read(self._spill_offset, 1000, refused)
            except OSError as exc:  # the file went, or no descriptor left: try again later
                return exc
            if refused.count:  # not a row this process wrote: never written
                with self._lock:
                    self._count_drop(False, f"the spill file held {refused.count} line(s) that are "
                                            f"not this process's rows ({refused.why})", refused.count)
            if not chunk:
                break
            items: list[object] = [_Insert(r.table, r.values) if r.key is None else _Update(r.table, r.key, r.values)
                                   for r in chunk]
            try:
                self._write(self._connection(), items)
            except _FileRefused as exc:
                return exc
            except _RowRejected:  # one bad row among them: row by row, counting the refused
                for it in items:
                    try:
                        self._write(self._connection(), [it])
                    except _RowRejected as exc:
                        self._rejected(it, str(exc))
            self._spill_offset = offset
            if until is not None and time.monotonic() > until:
                return None  # the rest on the next turn (a chunk a turn at least)
        self._spill_rows = 0
        self._spill_offset = 0
        try:
            self.spill_file.empty()  # kept (the run records it) until the writer closes
        except OSError:
            pass
        return None

    # -- the run file's identity ---------------------------------------------------------------

    def file_gone(self) -> str | None:
        """Why the run file can no longer be written by this process, if so (replaced,
        deleted: other connections of the process must not write there either)."""
        return self.error if self.error is not None and "during the run" in self.error else self._file_gone()

    def _file_gone(self) -> str | None:
        """Why the path no longer names the file this writer opened (None while it does)."""
        if self.file_id is None:
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return f"the run file {self.path} was deleted during the run"
        except OSError:
            return None  # cannot tell (no descriptor left, say): the write will say
        if (st.st_dev, st.st_ino) != self.file_id:
            return f"the run file {self.path} was replaced by another file during the run"
        for suffix in ("-wal", "-shm"):  # ours while the file is: removed with it if it goes
            try:
                side = os.stat(self.path + suffix)
                self._side_ids[suffix] = (side.st_dev, side.st_ino)
            except OSError:
                self._side_ids.pop(suffix, None)
        return None

    def _file_lost(self, why: str, items: list[object]) -> None:
        """Stop writing for good: the path is someone else's file now (or none). Closing the
        connection folds its WAL into the file it opened (by descriptor), and leaves no -wal
        for the new file to read."""
        with self._lock:
            self.error = f"{why}; recording stopped there"
        if self._spill_rows and self.spill_file is not None:  # rows meant for the lost file: lost with it
            try:
                steps = sum(1 for r in spill.rows(self.spill_file) if r.key is None and r.table == "steps")
            except OSError:
                steps = 0
            self.spill_file.remove()
            with self._lock:
                self._count_drop(False, self.error, self._spill_rows, steps)
            self._spill_rows = 0
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        # SQLite keeps the -wal of a moved database (it does not checkpoint a file that moved):
        # beside the new file it would be read into it ("database disk image is malformed").
        # Ours (the same inode as at the last write) goes; the rows in it were this run's.
        for suffix, ident in self._side_ids.items():
            try:
                st = os.stat(self.path + suffix)
                if (st.st_dev, st.st_ino) == ident:
                    os.remove(self.path + suffix)
            except OSError:
                pass
        self._lost(items)

    def _lost(self, items: list[object]) -> None:
        rows = [it for it in items if not getattr(it, "meta", False)]
        if rows:
            with self._lock:
                self._count_drop(False, self.error or "lost", len(rows), sum(_is_step(it) for it in rows))

    def _final_report(self) -> None:
        """At close, when structure rows were lost: one event with the totals (in the file, or
        in the spill file for the supervisor)."""
        message = (f"recording incomplete: {self.lost_steps} steps ({self.dropped_structure} rows) "
                   f"were lost: {self._drop_reason or self.last_error or 'write failed'}")
        data = {"lost_steps": self.lost_steps, "dropped_structure": self.dropped_structure,
                "dropped": self.dropped, "error": self._drop_reason}
        event = _Insert("events", self._event_row("recording_incomplete", message, data))
        try:
            left, refusal = self._write_all([event], [])  # first: within the margin kept for it
        except Exception as exc:  # noqa: BLE001
            left, refusal = [event], exc
        if refusal is not None or left:
            self._spill([event], "")

    def _recovered(self, now: float) -> None:
        since = self.degraded_since or now
        self.degraded_since = None
        self._retry = 0
        self._pending.insert(0, _Insert("events", self._event_row(
            "recording_recovered",
            f"the run file takes writes again after {now - since:.1f} s of errors ({self.last_error})",
            {"since": since, "until": now, "error": self.last_error, "dropped": self.dropped})))

    def _report_rows(self, now: float) -> list[object]:
        """An event for a drop reason not yet in the file (one per reason, with its start)."""
        reason = self._drop_reason
        if reason is None or self._reported == reason or self._reports >= MAX_REPORTS:
            return []
        since = self._drop_since or now
        if self.lost_steps:
            what = f"{self.lost_steps} steps lost ({self.dropped_structure} rows)"
        else:
            what = "memory samples dropped" if self.dropped_structure == 0 else "rows dropped"
        message = (f"recording degraded from {time.strftime('%H:%M:%S', time.localtime(since))}: "
                   f"{what} ({reason})")
        data = {"error": reason, "since": since, "dropped": self.dropped,
                "dropped_structure": self.dropped_structure, "lost_steps": self.lost_steps}
        return [_Insert("events", self._event_row("recording_degraded", message, data))]

    def _event_row(self, kind: str, message: str, data: dict[str, Any]) -> dict[str, Any]:
        return {"proc": self.proc_id, "t": time.time(), "step": None, "kind": kind,
                "message": message, "data": json.dumps(data)}

    def _heartbeat_row(self, now: float) -> object | None:
        if self.proc_id is None:
            return None
        try:
            samples = self.samples() if self.samples is not None else None
        except Exception:
            samples = None
        values: dict[str, Any] = {"heartbeat": now, "dropped": self.dropped}
        if samples is not None:
            values["samples"] = samples
        return _Update("processes", {"id": self.proc_id}, values, meta=True)

    # -- transactions --------------------------------------------------------------------------

    def _reconnect(self) -> None:
        """After a refusal the connection may be left in a state SQLite calls misuse; the
        next attempt opens a fresh one (opening is itself an attempt: it may fail too)."""
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
        self._conn = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            if self.error is not None:
                raise _FileRefused(sqlite3.OperationalError(self.error))
            # while the file refuses: short tries, so the training's rows are drained between
            try:
                conn = sqlite3.connect(self.path, timeout=self._try_s(), isolation_level=None,
                                       check_same_thread=False)
                tune(conn)
                if self.on_connect is not None:
                    self.on_connect(conn)
            except sqlite3.Error as exc:
                raise _FileRefused(exc) from None
            self._conn = conn
        return self._conn

    def _write_all(self, first: list[object], items: list[object]) -> tuple[list[object], BaseException | None]:
        """Write ``first`` then ``items``, in order. A chunk the database rejects for one bad
        row is halved until the row is found; that row alone is dropped (counted, explained).
        When the file itself refuses (after one quick retry), returns the items not yet
        committed and why."""
        if self.degraded_since is None:
            todo: list[list[object]] = [first + items]
        else:
            # after a refusal: the reason and the heartbeat alone first (an event and an
            # update may fit in pages the file already has when new rows no longer do), then
            # small transactions, so what fits is kept
            todo = [items[i:i + DEGRADED_CHUNK] for i in range(0, len(items), DEGRADED_CHUNK)][::-1]
            if first:
                todo.append(first)
        while todo:
            chunk = todo.pop()
            if self._closing and self.degraded_since is not None and chunk is not first and self._short_of_room():
                # the room left is for the count of what is lost and the end of the run
                return chunk + [it for rest in reversed(todo) for it in rest], \
                    _FileRefused(sqlite3.OperationalError("database or disk is full"))
            try:
                try:
                    self._write(self._connection(), chunk)
                except _FileRefused as first_refusal:
                    if _is_busy(first_refusal.error):
                        raise  # it already waited its busy timeout: no second wait as long
                    time.sleep(RETRY_S[0])
                    self._reconnect()
                    self._write(self._connection(), chunk)
            except _FileRefused as exc:
                return chunk + [it for rest in reversed(todo) for it in rest], exc
            except _RowRejected as exc:
                if len(chunk) > 1:
                    half = len(chunk) // 2
                    todo.append(chunk[half:])
                    todo.append(chunk[:half])
                else:
                    self._rejected(chunk[0], str(exc))
        return [], None

    def _short_of_room(self) -> bool:
        """A full disk at close, under the margin kept for the count and the run's end."""
        if "full" not in (self.last_error or ""):
            return False
        free = reserve.free_bytes(self.path)
        return free is not None and free < reserve.MARGIN_BYTES

    def _rejected(self, item: object, error: str) -> None:
        if getattr(item, "meta", False):
            self._beating = False  # the file has no heartbeat column: stop stamping
            return
        table = item.table if isinstance(item, _Insert) else "statement"
        with self._lock:
            self._count_drop(getattr(item, "sheddable", False), f"a {table} row was refused: {error}")
        self.last_error = error

    def _write(self, conn: sqlite3.Connection, batch: list[object]) -> None:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _FileRefused(exc) from None
        written = 0
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
                    rows = [tuple(b.row.values()) for b in batch[i:j] if isinstance(b, _Insert)]
                    # closed at once: a cursor another thread's gc.get_objects() list still
                    # holds would keep its statement open, and COMMIT would then refuse
                    conn.executemany(_insert_sql(item.table, cols), rows).close()
                    written += j - i
                    i = j
                else:
                    assert isinstance(item, _Update)
                    conn.execute(item.sql, item.params).close()
                    i += 1
            conn.execute("COMMIT")
        except (sqlite3.OperationalError, sqlite3.InterfaceError) as exc:
            # InterfaceError is SQLITE_MISUSE: a connection left unusable (after a disk-full
            # error, say), never one row's fault (a value it cannot bind is ProgrammingError)
            rollback_quietly(conn)
            if isinstance(exc, sqlite3.InterfaceError) or _is_file_level(exc):
                raise _FileRefused(exc) from None
            raise _RowRejected(str(exc)) from None
        except Exception as exc:  # IntegrityError, a value SQLite cannot bind: one row's fault
            rollback_quietly(conn)
            raise _RowRejected(f"{type(exc).__name__}: {exc}") from None
        self.written += written


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return (code & 0xFF) in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED
    return "locked" in str(exc)


def _is_step(item: object) -> int:
    return int(isinstance(item, _Insert) and item.table == "steps")


def _encode(item: object) -> str:
    if isinstance(item, _Insert):
        return spill.encode_insert(item.table, item.row)
    assert isinstance(item, _Update)
    return spill.encode_update(item.table, item.key, item.values)


class _RowRejected(Exception):
    """The batch holds a row (or statement) the database will not take."""


_FILE_LEVEL = ("full", "readonly", "read-only", "locked", "busy", "disk i/o", "i/o error",
               "unable to open", "no such table", "malformed", "not a database", "out of memory",
               "interrupted", "no more rows", "cannot commit", "file")


def _is_file_level(exc: sqlite3.Error) -> bool:
    """OperationalError covers both a refusing file (full, read-only, locked: retry later)
    and a bad statement; only the first kind is worth keeping rows for."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        # SQLITE_ERROR (1): a bad statement; everything else is the file or the system
        return (code & 0xFF) != 1
    text = str(exc).lower()
    return any(word in text for word in _FILE_LEVEL)


def _describe(exc: sqlite3.Error) -> str:
    name = getattr(exc, "sqlite_errorname", None)
    return f"{exc} ({name})" if name else str(exc)
