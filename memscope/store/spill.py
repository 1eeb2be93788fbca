"""The spill file: structure rows that waited too long for the run file, kept on disk.

While another process holds a lock on the run file (a ``sqlite3`` shell, a backup tool), the
writer keeps the rows it cannot write. Past a cap in memory it appends them here, beside the
run file, one JSON line per row, oldest first; when the lock goes, it (or, after the training
ended, attach's supervisor) replays them in order.

Only a file this run made is ever replayed (issue 34: a file another user planted beside a run
file was replayed into it, its text run as SQL). Each writing process makes its spill file when
it registers, while the run file takes writes: created exclusively (``O_EXCL|O_NOFOLLOW``), 0600
(0640 when the run file is group-readable), named ``RUN.db-spill-<token>`` with 16 random
bytes, its first line ``{"memscope_spill": 1, "token": ..., "pid": ..., "proc": ...}``. The
run file's ``side_files`` table records its name, token, owner uid, st_dev:st_ino, pid and
process in the same transaction as the process row, before any row goes to it. Replay takes a
file only when all of them match (a regular file, never a link), and builds its own statements
from the rows: a line is ``{"t": TABLE, "r": {COLUMN: VALUE}}`` (an insert) or ``{"u":
"processes", "k": {"id": PROC}, "s": {COLUMN: VALUE}}`` (an update of the writer's own process
row), never SQL. Every table and column is checked against memscope's schema, every value's
type against the column's, the process against the file's; replay is bounded in rows, bytes and
time. Anything else named ``RUN.db-spill-*`` is left alone and named in a warning.

The file's modification time is also a sign of life: the writer touches it while it waits,
so a reader does not call a run ``abandoned`` whose training is alive behind a lock.

Rows are memscope's own (numbers, strings, None); bytes, should one appear, are kept as base64.
Standard library only: this runs inside the training process.
"""

from __future__ import annotations

import base64
import glob
import json
import os
import re
import sqlite3
import stat
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from memscope.safe_files import create_new

SUFFIX = "-spill"
HEADER = "memscope_spill"
TOKEN_BYTES = 16
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")  # a table or column name memscope writes
# What replay takes from one spill file at most (a lock of hours spills about 100 MB an hour
# of a busy run); past any of them the rest is counted as not replayed, with the reason
MAX_REPLAY_ROWS = 20_000_000
MAX_REPLAY_BYTES = 4 << 30
MAX_REPLAY_S = 600.0
MAX_LINE = 64 << 20  # one row's line at most (an inventory's groups are the longest)
# memscope's own tables a spill file never writes: the run row, the migrations, these records
_NOT_SPILLED = frozenset({"run", "migrations", "side_files", "processes"})
# the process row's columns a writer updates (its heartbeat, how it ended, its device)
_UPDATABLE = frozenset({"device", "ended", "status", "samples", "dropped", "step_mode", "heartbeat"})
_INT64 = (-(1 << 63), (1 << 63) - 1)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def spill_files(db: str) -> list[str]:
    """Every file named like a spill file beside ``db`` (whoever made it)."""
    return sorted(glob.glob(glob.escape(db) + SUFFIX + "-*"))


def total_size(db: str) -> int:
    return sum(size(p) for p in spill_files(db))


def size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


# -- the file --------------------------------------------------------------------------------


@dataclass
class SpillFile:
    """One writer's spill file, as made and recorded."""

    path: str
    token: str
    uid: int
    dev: int
    ino: int
    pid: int
    proc: int | None
    header: int = 0  # bytes of the first line

    @classmethod
    def create(cls, db: str, proc: int | None, mode: int | None = None) -> "SpillFile":
        """Make a new spill file for ``db`` (OSError when it cannot be made). ``mode``: 0600,
        or the run file's group read when it has it."""
        if mode is None:
            try:
                mode = 0o640 if os.stat(db).st_mode & 0o040 else 0o600
            except OSError:
                mode = 0o600
        token = os.urandom(TOKEN_BYTES).hex()
        path = f"{db}{SUFFIX}-{token}"
        fd = create_new(path, mode)
        try:
            line = (json.dumps({HEADER: 1, "token": token, "pid": os.getpid(), "proc": proc},
                               separators=(",", ":")) + "\n").encode()
            os.write(fd, line)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            _unlink(path)
            raise
        os.close(fd)
        return cls(path, token, st.st_uid, st.st_dev, st.st_ino, os.getpid(), proc, len(line))

    def record(self) -> dict[str, Any]:
        """The ``side_files`` row that lets this file be replayed."""
        return {"proc": self.proc, "kind": "spill", "name": os.path.basename(self.path),
                "token": self.token, "uid": self.uid, "file_id": f"{self.dev}:{self.ino}",
                "pid": self.pid, "created": time.time()}

    def _open(self, flags: int) -> int:
        """A descriptor of the file, only while the path is still the file made (never a link)."""
        fd = os.open(self.path, flags | _NOFOLLOW)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (self.dev, self.ino):
            os.close(fd)
            raise OSError("replaced by another file than the one this process made")
        return fd

    def append(self, lines: list[str]) -> None:
        """Append encoded rows; raises OSError (a full disk, no descriptor left, the file gone
        or replaced: never re-created). Opened and closed each time: a long wait must not hold
        a descriptor the training may need."""
        if not lines:
            return
        fd = self._open(os.O_WRONLY | os.O_APPEND)
        with open(fd, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")

    def empty(self) -> None:
        """Back to its first line (its rows are in the run file now)."""
        fd = self._open(os.O_WRONLY)
        try:
            os.ftruncate(fd, self.header)
        finally:
            os.close(fd)

    def touch(self) -> None:
        try:
            fd = self._open(os.O_RDONLY)
        except OSError:
            return
        try:
            os.utime(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def size(self) -> int:
        return size(self.path)

    def remove(self) -> None:
        """Remove the file, if the path still names it."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return
        if (st.st_dev, st.st_ino) == (self.dev, self.ino):
            _unlink(self.path)

    def read(self, offset: int, limit: int, refused: Refused | None = None) -> tuple[list[Row], int]:
        """Up to ``limit`` rows from byte ``offset`` (after the first line): see :func:`_read`."""
        fd = self._open(os.O_RDONLY)
        with open(fd, "rb") as f:
            if offset < self.header:
                f.seek(0)
                if _header(f.readline(MAX_LINE + 1)) != self.token:
                    raise OSError("its first line does not carry this run's token")
                offset = self.header
            return _read(f, offset, limit, self.proc, refused)


def _unlink(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# -- rows ------------------------------------------------------------------------------------


@dataclass
class Row:
    """A checked row: an insert (``key`` None) or an update of the process row."""

    table: str
    values: dict[str, Any]
    key: dict[str, Any] | None = None


def _plain(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(v)).decode("ascii")}
    return v


def _value(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"$b"} and isinstance(v["$b"], str):
        return base64.b64decode(v["$b"], validate=True)
    return v


def encode_insert(table: str, row: dict[str, Any]) -> str:
    return json.dumps({"t": table, "r": {k: _plain(v) for k, v in row.items()}},
                      separators=(",", ":"))


def encode_update(table: str, key: dict[str, Any], values: dict[str, Any]) -> str:
    return json.dumps({"u": table, "k": {k: _plain(v) for k, v in key.items()},
                       "s": {k: _plain(v) for k, v in values.items()}}, separators=(",", ":"))


def _columns() -> dict[str, dict[str, tuple[str, bool]]]:
    from memscope.store.schema import SCHEMA_VERSION, expected_tables

    return expected_tables(SCHEMA_VERSION)


def _type_ok(declared: str, notnull: bool, v: Any) -> bool:
    if v is None:
        return not notnull
    if declared in ("INTEGER", "REAL"):  # SQLite keeps a float in an INTEGER column as it is
        return isinstance(v, (int, float))
    if declared == "TEXT":
        return isinstance(v, str)
    return isinstance(v, (int, float, str, bytes))


def check_row(row: Row, proc: int | None) -> str | None:
    """Why ``row`` may not be written from a spill file of process ``proc`` (None: it may)."""
    tables = _columns()
    columns = tables.get(row.table)
    if row.key is None:
        if columns is None or row.table in _NOT_SPILLED:
            return f"not a table a spill file writes: {row.table!r}"
        if proc is None or row.values.get("proc") != proc or isinstance(row.values.get("proc"), bool):
            return f"a {row.table} row of another process ({row.values.get('proc')!r})"
        allowed: set[str] | frozenset[str] = set(columns)
    else:
        if row.table != "processes" or columns is None:
            return f"an update of {row.table!r} (only the writer's own process row is updated)"
        if proc is None or set(row.key) != {"id"} or row.key["id"] != proc or isinstance(row.key["id"], bool):
            return f"an update of another process row ({row.key!r})"
        allowed = _UPDATABLE
        if "status" in row.values and row.values["status"] not in ("running", "stopped", "lost"):
            return f"a process status {row.values['status']!r}"
    if not row.values:
        return "a row without values"
    for name, value in row.values.items():
        if name not in allowed:
            return f"column {name!r} of {row.table}"
        declared, notnull = columns[name]
        if not _type_ok(declared, notnull, value):
            return f"{row.table}.{name} = {type(value).__name__} (the column is {declared or 'untyped'})"
        if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
            return f"{row.table}.{name}: a number out of range"
    return None


def _object(line: bytes) -> dict[str, Any] | None:
    try:
        item = json.loads(line)
    except ValueError:
        return None
    return item if isinstance(item, dict) else None


def _parse(line: bytes) -> Row | None:
    """One line as a row, or None when it is not one memscope writes."""
    item = _object(line)
    if item is None:
        return None
    try:
        if set(item) == {"t", "r"} and isinstance(item["r"], dict):
            row = Row(item["t"], {k: _value(v) for k, v in item["r"].items()})
        elif set(item) == {"u", "k", "s"} and isinstance(item["k"], dict) and isinstance(item["s"], dict):
            row = Row(item["u"], {k: _value(v) for k, v in item["s"].items()},
                      {k: _value(v) for k, v in item["k"].items()})
        else:
            return None
    except (ValueError, TypeError):  # base64 that is not
        return None
    names = [row.table, *row.values, *(row.key or {})]
    if not all(isinstance(n, str) and _NAME.match(n) for n in names):
        return None
    return row


def _header(line: bytes) -> str | None:
    """The token of a spill file's first line, or None."""
    item = _object(line)
    if item is not None and item.get(HEADER) == 1 and isinstance(item.get("token"), str):
        return str(item["token"])
    return None


@dataclass
class Refused:
    """Lines of a spill file that were not written, and why (the first reason)."""

    count: int = 0
    why: str | None = None

    def add(self, why: str) -> None:
        self.count += 1
        self.why = self.why or why


def _read(f: Any, offset: int, limit: int, proc: int | None,
          refused: Refused | None = None) -> tuple[list[Row], int]:
    """Up to ``limit`` checked rows from byte ``offset`` and the offset after them. A torn last
    line (the process died mid-append) ends the file; a line that is not a row memscope writes
    for this process is skipped (counted in ``refused``)."""
    out: list[Row] = []
    f.seek(offset)
    while len(out) < limit:
        line = f.readline(MAX_LINE + 1)
        if not line.endswith(b"\n"):
            if len(line) > MAX_LINE:  # too long to be a row: skip to the next line
                offset += len(line)
                while line and not line.endswith(b"\n"):
                    line = f.readline(MAX_LINE + 1)
                    offset += len(line)
                if refused is not None:
                    refused.add("a line longer than any row")
                continue
            break
        offset += len(line)
        row = _parse(line)
        why = "not a row" if row is None else check_row(row, proc)
        if why is not None:
            if refused is not None:
                refused.add(why)
            continue
        assert row is not None
        out.append(row)
    return out, offset


def statement(row: Row) -> tuple[str, tuple[Any, ...]]:
    """The SQL of a checked row (names from memscope's schema, values bound)."""
    cols = tuple(row.values)
    if row.key is None:
        return (f"INSERT INTO {row.table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                tuple(row.values.values()))
    keys = tuple(row.key)
    return (f"UPDATE {row.table} SET {', '.join(f'{c} = ?' for c in cols)} "
            f"WHERE {' AND '.join(f'{k} = ?' for k in keys)}",
            (*row.values.values(), *row.key.values()))


# -- replay by the supervisor -----------------------------------------------------------------


@dataclass
class Replay:
    """What replaying the spill files beside a run file did."""

    rows: int = 0
    refused: int = 0  # lines of recorded files that were not rows memscope writes
    refused_why: str | None = None
    stopped: str | None = None  # a bound that stopped a replay
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (path, why) never replayed


def recorded(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """The spill files the run file records (none in a file older than the table)."""
    try:
        cur = conn.execute("SELECT proc, name, token, uid, file_id, pid FROM side_files WHERE kind = 'spill'")
    except sqlite3.Error:
        return []
    return [dict(zip(("proc", "name", "token", "uid", "file_id", "pid"), r)) for r in cur.fetchall()]


def verify(db: str, rec: dict[str, Any]) -> tuple[SpillFile | None, str]:
    """The recorded spill file when the path is still it (a regular file of the recorded owner
    and inode); else None and why."""
    name = rec.get("name")
    if not isinstance(name, str) or os.path.basename(name) != name or not name.startswith(
            os.path.basename(db) + SUFFIX + "-"):
        return None, "not a name this run's spill files have"
    path = os.path.join(os.path.dirname(db), name)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, "gone"
    except OSError as exc:
        return None, exc.strerror or str(exc)
    dev, _, ino = str(rec.get("file_id")).partition(":")
    if stat.S_ISLNK(st.st_mode):
        return None, "a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return None, "not a regular file"
    if st.st_uid != rec.get("uid"):
        return None, f"owned by uid {st.st_uid}, not {rec.get('uid')} who made it"
    if f"{st.st_dev}:{st.st_ino}" != f"{dev}:{ino}":
        return None, "another file than the one this run made (its inode differs)"
    token = rec.get("token")
    if not isinstance(token, str):
        return None, "no token recorded"
    proc = rec.get("proc") if isinstance(rec.get("proc"), int) else None
    return SpillFile(path, token, st.st_uid, st.st_dev, st.st_ino, int(rec.get("pid") or 0), proc), ""


def replay_all(db: str, conn: sqlite3.Connection) -> Replay:
    """Replay every spill file the run file records into ``conn`` (one transaction each), then
    remove it; every other file named like a spill file is ignored (named in the result)."""
    out = Replay()
    made = {r.get("name") for r in recorded(conn)}
    for rec in recorded(conn):
        sf, why = verify(db, rec)
        if sf is None:
            if why != "gone":
                out.ignored.append((os.path.join(os.path.dirname(db), str(rec.get("name"))), why))
            continue
        try:
            _replay_one(sf, conn, out)
        except OSError as exc:
            out.ignored.append((sf.path, str(exc.strerror or exc)))
    for path in spill_files(db):
        if os.path.basename(path) not in made:
            out.ignored.append((path, "not made by this run"))
    return out


def _replay_one(sf: SpillFile, conn: sqlite3.Connection, out: Replay) -> None:
    """One verified file into ``conn``, within the bounds; removed once its rows are in."""
    fd = sf._open(os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    refused = Refused()
    until = time.monotonic() + MAX_REPLAY_S
    n = 0
    with open(fd, "rb") as f:
        first = f.readline(MAX_LINE + 1)
        if _header(first) != sf.token:
            raise OSError("its first line does not carry this run's token")
        offset = len(first)
        conn.execute("BEGIN IMMEDIATE")
        try:
            while True:
                rows, offset = _read(f, offset, 1000, sf.proc, refused)
                if not rows:
                    break
                for row in rows:
                    if n >= MAX_REPLAY_ROWS or offset > MAX_REPLAY_BYTES or time.monotonic() > until:
                        out.stopped = (f"{sf.path}: replay stopped at {n} rows (bounds: "
                                       f"{MAX_REPLAY_ROWS} rows, {MAX_REPLAY_BYTES >> 20} MiB, "
                                       f"{MAX_REPLAY_S:.0f} s)")
                        break
                    sql, params = statement(row)
                    try:
                        conn.execute(sql, params).close()
                    except (sqlite3.IntegrityError, sqlite3.InterfaceError, OverflowError) as exc:
                        refused.add(f"refused by the file: {exc}")
                        continue
                    n += 1
                if out.stopped:
                    break
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    out.rows += n
    out.refused += refused.count
    out.refused_why = out.refused_why or refused.why
    sf.remove()


def rows(sf: SpillFile) -> Iterator[Row]:
    """Every checked row of ``sf`` (the writer's own count of what is in it)."""
    offset = 0
    while True:
        chunk, offset = sf.read(offset, 1000)
        if not chunk:
            return
        yield from chunk
