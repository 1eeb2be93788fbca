"""The spill file: structure rows that waited too long for the run file, kept on disk.

While another process holds a lock on the run file (a ``sqlite3`` shell, a backup tool), the
writer keeps the rows it cannot write. Past a cap in memory it appends them here, beside the
run file (``RUN.db-spill-PID``: one per writing process, as ranks may share a run file), one
JSON line per row, oldest first; when the lock goes, it (or,
after the training ended, attach's supervisor) replays them in order and removes the file.

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
from typing import Any, Iterator, Sequence

SUFFIX = "-spill"
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")  # a table or column name memscope writes


def spill_path(db: str, pid: int | None = None) -> str:
    """The spill file of process ``pid`` (this one by default) for the run file ``db``."""
    return f"{db}{SUFFIX}-{pid if pid is not None else os.getpid()}"


def spill_files(db: str) -> list[str]:
    """Every process's spill file beside ``db``."""
    return sorted(glob.glob(glob.escape(db) + SUFFIX + "-*"))


def total_size(db: str) -> int:
    return sum(size(p) for p in spill_files(db))


def replay_all(db: str, conn: sqlite3.Connection) -> int:
    """Replay every spill file beside ``db`` into ``conn``; the rows written."""
    return sum(replay(p, conn) for p in spill_files(db))


def _plain(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(v)).decode("ascii")}
    return v


def _value(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"$b"}:
        return base64.b64decode(v["$b"])
    return v


def encode_insert(table: str, row: dict[str, Any]) -> str:
    return json.dumps({"t": table, "r": {k: _plain(v) for k, v in row.items()}},
                      separators=(",", ":"))


def encode_exec(sql: str, params: Sequence[Any]) -> str:
    return json.dumps({"x": sql, "p": [_plain(v) for v in params]}, separators=(",", ":"))


def append(path: str, lines: list[str]) -> None:
    """Append encoded rows; raises OSError (a full disk, no file descriptor left). Opened and
    closed each time: a long wait must not hold a descriptor the training may need."""
    if not lines:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def touch(path: str) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def read(path: str, offset: int, limit: int) -> tuple[list[tuple[str, Any, Any]], int]:
    """Up to ``limit`` rows from byte ``offset``: (kind, table or sql, row or params) and the
    offset after them. A torn last line (the process died mid-append) ends the file."""
    out: list[tuple[str, Any, Any]] = []
    with open(path, "rb") as f:
        f.seek(offset)
        while len(out) < limit:
            line = f.readline()
            if not line.endswith(b"\n"):
                break
            offset += len(line)
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if "t" in item:
                if not (_NAME.match(str(item["t"])) and all(_NAME.match(str(k)) for k in item["r"])):
                    continue  # not a row memscope wrote
                out.append(("insert", str(item["t"]), {k: _value(v) for k, v in item["r"].items()}))
            elif "x" in item and str(item["x"]).startswith("UPDATE processes SET "):
                out.append(("exec", str(item["x"]), [_value(v) for v in item["p"]]))
    return out, offset


def rows(path: str) -> Iterator[tuple[str, Any, Any]]:
    offset = 0
    while True:
        chunk, offset = read(path, offset, 1000)
        if not chunk:
            return
        yield from chunk


def replay(path: str, conn: sqlite3.Connection) -> int:
    """Write every row of the spill file at ``path`` into ``conn`` (one transaction), then
    remove the file. Returns the rows written; raises sqlite3.Error (the file is kept)."""
    if not os.path.exists(path):
        return 0
    n = 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        for kind, what, values in rows(path):
            if kind == "insert":
                cols = tuple(values)
                conn.execute(f"INSERT INTO {what} ({', '.join(cols)}) "  # memscope's own names
                             f"VALUES ({', '.join('?' for _ in cols)})", tuple(values.values()))
            else:
                conn.execute(what, tuple(values))
            n += 1
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    try:
        os.remove(path)
    except OSError:
        pass
    return n
