"""The node file: what ``memscope daemon`` saw on this host, in a small SQLite file of its own.

Not a run file: its own application id (``MEMN``) and schema, so nothing mistakes it for the
record of one training (``memscope report`` and ``memscope tui`` tell the two apart by it).

- ``node``: one row: the host, when the daemon started and ended, its options, its status.
- ``processes``: one row per torch process seen (pid and start time: a reused pid is another
  row): its user, its command (secrets taken out), first and last seen, when it ended, its peak
  host RSS and GPU memory and when, the run file it held open when last seen.
- ``samples``: per process, one row per sample while recent; older ones folded into windows of
  time (:mod:`memscope.node.nodefold`): ``t``..``t_end`` covering ``n`` samples, with the lowest
  and highest host RSS and GPU memory of the window. A raw sample has t = t_end, n = 1.
- ``events``: leak suspects (flagged, cleared), attaches and their verdicts, daemon starts and
  stops, with JSON data.

Created exclusively (``O_EXCL``, never through a link, 0600), as run files are; a daemon holds an
exclusive ``flock`` on it while it writes, so a second daemon is refused. An existing node file is
continued (a restarted daemon appends to its history); anything else at the path is refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sqlite3
import stat
import time
from typing import Any

from memscope import __version__
from memscope.safe_files import create_new
from memscope.store.schema import RunFileError

NODE_APPLICATION_ID = 0x4D454D4E  # "MEMN" (a run file is "MEMS")
NODE_SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE node (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    host TEXT,
    memscope_version TEXT,
    started REAL NOT NULL,          -- unix seconds, the first daemon's start
    ended REAL,
    status TEXT NOT NULL,           -- running | finished
    owner_pid INTEGER,              -- the daemon writing it
    heartbeat REAL,                 -- its last write
    options TEXT                    -- JSON: interval, window, prometheus address, auto-attach
);
CREATE TABLE processes (
    id INTEGER PRIMARY KEY,
    pid INTEGER NOT NULL,
    started REAL NOT NULL,          -- the process's start (with the pid: who it is)
    uid INTEGER,
    user TEXT,
    command TEXT NOT NULL,          -- JSON list, secrets taken out
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    ended REAL,                     -- first sample it was gone
    last_rss INTEGER,
    peak_rss INTEGER, peak_rss_t REAL,
    last_gpu INTEGER,
    gpu_devices TEXT,               -- JSON {device index: bytes} at the last sample (NULL: no NVML reading)
    peak_gpu INTEGER, peak_gpu_t REAL,
    run_file TEXT,                  -- the memscope run file it held open when last seen
    UNIQUE (pid, started)
);
CREATE TABLE samples (
    proc INTEGER NOT NULL,
    t REAL NOT NULL,
    t_end REAL NOT NULL,
    n INTEGER NOT NULL,
    rss_min INTEGER, rss_max INTEGER,
    gpu_min INTEGER, gpu_max INTEGER
);
CREATE INDEX samples_proc_t ON samples (proc, t);
CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    t REAL NOT NULL,
    proc INTEGER,
    kind TEXT NOT NULL,             -- daemon_started | daemon_stopped | suspect | suspect_cleared |
                                    -- attach_started | attach_done | attach_skipped
    message TEXT NOT NULL,
    data TEXT
);
"""


def is_node_file(path: str) -> bool:
    """A file whose SQLite header carries the node file's application id."""
    from memscope.store.runs import application_id

    return application_id(path) == NODE_APPLICATION_ID


def default_node_path() -> str:
    """``memscope-node-<host>.db`` in the working directory."""
    host = "".join(c if c.isalnum() or c in "._-" else "_" for c in socket.gethostname()) or "host"
    return f"memscope-node-{host}.db"


def _claim(path: str) -> None:
    """Create an empty file at ``path`` as every memscope file is made (memscope.safe_files:
    exclusively, never through a link, 0600 whatever the umask)."""
    try:
        fd = create_new(path)
    except FileExistsError:
        raise RunFileError(f"{path}: created at the same moment by another process; choose another path") from None
    except OSError as exc:
        raise RunFileError(f"{path}: cannot create the node file ({exc.strerror})") from None
    os.close(fd)


def _check_existing(path: str) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise RunFileError(f"{path}: is a symbolic link (to {os.readlink(path)}); give the file's own path")
    if not stat.S_ISREG(st.st_mode):
        raise RunFileError(f"{path}: exists and is not a regular file; refusing to write into it")
    if not is_node_file(path):
        raise RunFileError(f"{path}: exists and is not a memscope node file; refusing to write into it "
                           "(give another --db)")
    if st.st_uid != os.geteuid():
        raise RunFileError(f"{path}: belongs to another user (uid {st.st_uid}); memscope writes only "
                           "node files of its own")


def open_for_writing(path: str) -> tuple[sqlite3.Connection, int, bool]:
    """(connection, the fd holding the daemon's lock, whether the file is new). A new file is
    created exclusively; an existing node file is continued; RunFileError (one line) otherwise."""
    new = not os.path.lexists(path)
    if new:
        from memscope.store.runs import prepare_path  # the writing side only (report needs none of it)

        prepare_path(path, force=False, force_word="--db with another path")
        _claim(path)
    else:
        _check_existing(path)
    try:
        lock = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise RunFileError(f"{path}: cannot open the node file ({exc.strerror})") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        raise RunFileError(f"{path}: another memscope daemon writes it{_owner(path)}; give another --db") from None
    try:
        conn = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
        if new:  # before WAL mode: the header (the application id) is then in the file itself at once
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA application_id = {NODE_APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {NODE_SCHEMA_VERSION}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        if not new:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > NODE_SCHEMA_VERSION:
                raise RunFileError(f"{path}: written by a newer memscope (node schema {version}); upgrade "
                                   "memscope or give another --db")
    except sqlite3.Error as exc:
        os.close(lock)
        if new:
            os.remove(path)
        raise RunFileError(f"{path}: cannot write the node file ({' '.join(str(exc).split())})") from None
    except BaseException:
        os.close(lock)
        raise
    return conn, lock, new


def _owner(path: str) -> str:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        try:
            row = conn.execute("SELECT owner_pid FROM node WHERE id = 1").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return ""
    return f" (pid {row[0]})" if row and row[0] else ""


class NodeWriter:
    """The daemon's side of a node file: one transaction per sample, events, folding, the end."""

    def __init__(self, path: str, options: dict[str, Any]) -> None:
        self.path = path
        self.conn, self._lock, self.new = open_for_writing(path)
        self._ids: dict[tuple[int, float], int] = {}
        self._alive: set[int] = set()
        self._gpu_why: str | None = None
        now = time.time()
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute(
                "INSERT INTO node (id, host, memscope_version, started, status, owner_pid, heartbeat, options)"
                " VALUES (1, ?, ?, ?, 'running', ?, ?, ?) ON CONFLICT (id) DO UPDATE SET status = 'running',"
                " ended = NULL, owner_pid = excluded.owner_pid, heartbeat = excluded.heartbeat,"
                " options = excluded.options, memscope_version = excluded.memscope_version",
                (socket.gethostname(), __version__, now, os.getpid(), now, json.dumps(options)))
            # processes a previous daemon saw and never saw end: ended when it stopped, as far as we know
            self.conn.execute("UPDATE processes SET ended = last_seen WHERE ended IS NULL")
        self.event("daemon_started", f"memscope daemon (pid {os.getpid()}) started"
                   + ("" if self.new else "; continuing this node file"), {"pid": os.getpid(), **options})

    def proc_id(self, pid: int, started: float) -> int | None:
        return self._ids.get((pid, round(started, 2)))

    def write(self, snap: Any) -> None:
        """One sample of every process (a :class:`memscope.node.monitor.Snapshot`)."""
        t = snap.t
        seen: set[int] = set()
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            for row in snap.processes:
                proc = self._proc(row, t)
                seen.add(proc)
                gpu = row.gpu_bytes
                devices = None if row.gpu_by_device is None else json.dumps(
                    {str(k): v for k, v in sorted(row.gpu_by_device.items())})
                self.conn.execute(
                    "UPDATE processes SET last_seen = ?, last_rss = ?, last_gpu = ?, gpu_devices = ?, run_file = ?,"
                    " ended = NULL,"
                    " peak_rss_t = CASE WHEN peak_rss IS NULL OR ? > peak_rss THEN ? ELSE peak_rss_t END,"
                    " peak_rss = max(coalesce(peak_rss, 0), ?),"
                    " peak_gpu_t = CASE WHEN ? IS NOT NULL AND (peak_gpu IS NULL OR ? > peak_gpu) THEN ?"
                    " ELSE peak_gpu_t END,"
                    " peak_gpu = CASE WHEN ? IS NULL THEN peak_gpu ELSE max(coalesce(peak_gpu, 0), ?) END"
                    " WHERE id = ?",
                    (t, row.host_rss_bytes, gpu, devices, row.run_file, row.host_rss_bytes, t, row.host_rss_bytes,
                     gpu, gpu, t, gpu, gpu, proc))
                self.conn.execute("INSERT INTO samples (proc, t, t_end, n, rss_min, rss_max, gpu_min, gpu_max)"
                                  " VALUES (?, ?, ?, 1, ?, ?, ?, ?)",
                                  (proc, t, t, row.host_rss_bytes, row.host_rss_bytes, gpu, gpu))
            for proc in self._alive - seen:
                self.conn.execute("UPDATE processes SET ended = ? WHERE id = ? AND ended IS NULL", (t, proc))
            self.conn.execute("UPDATE node SET heartbeat = ? WHERE id = 1", (t,))
        self._alive = seen
        if snap.gpu_why != self._gpu_why:
            self._gpu_why = snap.gpu_why
            self.set_option("gpu_why", snap.gpu_why)

    def _proc(self, row: Any, t: float) -> int:
        key = (row.pid, round(row.started, 2))
        proc = self._ids.get(key)
        if proc is not None:
            return proc
        found = self.conn.execute("SELECT id FROM processes WHERE pid = ? AND abs(started - ?) < 0.01",
                                  (row.pid, row.started)).fetchone()
        if found is not None:
            proc = int(found[0])
        else:
            cur = self.conn.execute(
                "INSERT INTO processes (pid, started, uid, user, command, first_seen, last_seen)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (row.pid, round(row.started, 2), row.uid, row.user, json.dumps(row.argv), t, t))
            proc = int(cur.lastrowid or 0)
        self._ids[key] = proc
        return proc

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None, proc: int | None = None,
              t: float | None = None) -> None:
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute("INSERT INTO events (t, proc, kind, message, data) VALUES (?, ?, ?, ?, ?)",
                              (time.time() if t is None else t, proc, kind, message,
                               None if data is None else json.dumps(data)))

    def set_option(self, key: str, value: Any) -> None:
        """One more fact in the node row's options (the exporter's bound address)."""
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            row = self.conn.execute("SELECT options FROM node WHERE id = 1").fetchone()
            options = json.loads(row[0]) if row and row[0] else {}
            options[key] = value
            self.conn.execute("UPDATE node SET options = ? WHERE id = 1", (json.dumps(options),))

    def fold(self, now: float | None = None) -> int:
        from memscope.node.nodefold import fold

        return fold(self.conn, time.time() if now is None else now)

    def close(self) -> None:
        """The daemon's end: the status, the -wal folded in, the lock let go."""
        now = time.time()
        try:
            self.event("daemon_stopped", f"memscope daemon (pid {os.getpid()}) stopped", {"pid": os.getpid()})
            with self.conn:
                self.conn.execute("BEGIN IMMEDIATE")
                self.conn.execute("UPDATE node SET status = 'finished', ended = ?, heartbeat = ? WHERE id = 1",
                                  (now, now))
            try:
                self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self.conn.execute("PRAGMA journal_mode=DELETE")
            except sqlite3.Error:
                pass
        finally:
            self.conn.close()
            os.close(self._lock)
