"""Run and process rows: created once, finished once, outside the hot path."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from typing import Any

from memscope import __version__
from memscope.store.schema import RunFileError
from memscope.store.writer import close_for_copy, connect_rw


def prepare_path(path: str, force: bool) -> None:
    """Make sure a new run file can be created at ``path``; raise RunFileError with why not."""
    if os.path.isdir(path):
        raise RunFileError(f"{path}: is a directory; give a file name with --db")
    if os.path.exists(path):
        if not force:
            raise RunFileError(f"{path}: already exists; pass --force to overwrite it")
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                os.remove(path + suffix)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise RunFileError(f"{path}: cannot overwrite ({exc.strerror})") from None
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise RunFileError(f"{path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunFileError(f"{path}: directory {parent} is not writable")


def create_run(path: str, command: list[str], started: float | None = None) -> None:
    """Create the run file with its single run row (status ``running``)."""
    try:
        conn = connect_rw(path)
    except (sqlite3.Error, OSError) as exc:
        raise RunFileError(f"{path}: cannot create run file ({exc})") from None
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT OR IGNORE INTO run (id, command, cwd, host, memscope_version, started, status)"
                " VALUES (1, ?, ?, ?, ?, ?, 'running')",
                (json.dumps(command), os.getcwd(), socket.gethostname(), __version__,
                 started or time.time()),
            )
    finally:
        conn.close()


def register_process(path: str, info: dict[str, Any]) -> int:
    """Insert this process's row and return its id (the ``proc`` of every row it writes)."""
    conn = connect_rw(path)
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            cols = ", ".join(info)
            marks = ", ".join("?" for _ in info)
            cur = conn.execute(f"INSERT INTO processes ({cols}) VALUES ({marks})", tuple(info.values()))
            return int(cur.lastrowid)  # type: ignore[arg-type]
    finally:
        conn.close()


def finish_run(path: str, exit_code: int | None, signal: int | None,
               ended: float | None = None, status: str | None = None) -> None:
    """Record how the run ended; mark processes that never said goodbye as lost; compact."""
    ended = ended or time.time()
    if status is not None:
        pass
    elif signal is not None:
        status = "killed"
    elif exit_code == 0:
        status = "finished"
    else:
        status = "failed"
    conn = connect_rw(path)
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "UPDATE run SET ended = ?, exit_code = ?, signal = ?, status = ? WHERE id = 1",
                (ended, exit_code, signal, status),
            )
            conn.execute(
                "UPDATE processes SET status = 'lost', ended = ? WHERE status = 'running'",
                (ended,),
            )
        close_for_copy(conn)
    finally:
        conn.close()


def default_db_path(command: list[str], now: float | None = None) -> str:
    """``memscope-<script>-<YYYYmmdd-HHMMSS>.db`` in the working directory."""
    stem = "run"
    for word in command:
        base = os.path.basename(word)
        if base.endswith(".py"):
            stem = base[:-3]
            break
    else:
        if command:
            stem = os.path.basename(command[0]) or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    path = f"memscope-{stem}-{stamp}.db"
    n = 1
    while os.path.exists(path):
        n += 1
        path = f"memscope-{stem}-{stamp}-{n}.db"
    return path
