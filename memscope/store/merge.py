"""Combine the run files of several nodes (one file per host) into one run file.

Every process of every input gets a new id in the output; every table with a ``proc`` column is
copied with ``proc`` remapped. The table list is read from each input's ``sqlite_master``, so a
table added by a later schema is copied without code here knowing its name. The single ``run``
row is combined: started = earliest, ended = latest (unknown while any node is unfinished),
exit code / signal / status = the worst node's.

Each node writes its own file on local disk: SQLite's locking is unreliable on network
filesystems (NFS, SMB, most cluster shares), so ranks of different hosts must never share one.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from memscope.redact import Redaction
from memscope.store.merge_check import check_distinct_ranks, check_one_job
from memscope.store.reader import RunReader
from memscope.store.runs import FileId, claim, discard_run, file_id, prepare_path
from memscope.store.schema import RunFileError
from memscope.store.writer import close_for_copy, connect_rw

# Tables handled by hand (or owned by the output file itself).
_SPECIAL = {"run", "processes", "migrations", "side_files"}  # (the inputs' spill files are not the output's)
_STATUS_RANK = {"finished": 0, "running": 1, "interrupted": 2, "failed": 2, "killed": 3,
                "abandoned": 3}
_CHUNK = 5000


@dataclass
class MergeResult:
    path: str
    inputs: list[str]
    processes: int
    rows: dict[str, int] = field(default_factory=dict)  # rows copied per table
    skipped_tables: list[str] = field(default_factory=list)  # tables without a proc column
    missing_ranks: list[int] = field(default_factory=list)  # ranks of the job no input holds
    live: list[str] = field(default_factory=list)  # inputs still being written (allow_live)


class LiveInputs(RunFileError):
    """Inputs whose runs are still being written: a merge now would miss their later rows."""


def merge_runs(out: str, inputs: Sequence[str], force: bool = False,
               one_job: bool = True, allow_live: bool = False, group_readable: bool = False) -> MergeResult:
    """Write ``out`` from ``inputs``; raise RunFileError (one line) for unusable input,
    LiveInputs for inputs still being written unless ``allow_live``, and NotOneJob for inputs
    that are not the ranks of one job unless ``one_job`` is False (then only a global rank held
    by two inputs is refused)."""
    if not inputs:
        raise RunFileError("no input run files given")
    _check_distinct(out, inputs)
    readers = [RunReader(p) for p in inputs]
    try:
        versions = {r.version for r in readers}
        if len(versions) > 1:
            detail = ", ".join(f"{r.path}: {r.version}" for r in readers)
            raise RunFileError(f"run files of different schema versions cannot be merged ({detail})")
        for r in readers:  # every table is copied: every value checked first (column_guard.py)
            r.check_tables()
        live = [r.path for r in readers if (r.run() or {}).get("status") == "running"]
        if live and not allow_live:
            raise LiveInputs(f"still being written (their runs say running and a writer is "
                             f"alive): {', '.join(live)}")
        missing = check_one_job(readers) if one_job else []
        check_distinct_ranks(readers)
        prepare_path(out, force)
        created = claim(out, group_readable)  # exclusively, before SQLite opens it
        try:
            result = _write(out, readers, created)
            result.missing_ranks = missing
            result.live = live
            return result
        except BaseException:
            discard_run(out, created)  # the half-written file and its WAL / journal
            raise
    finally:
        for r in readers:
            r.close()


def _check_distinct(out: str, inputs: Sequence[str]) -> None:
    seen: list[str] = []
    for p in inputs:
        if not os.path.isfile(p):
            continue  # RunReader says why, in its own words
        for q in seen:
            if os.path.samefile(p, q):
                raise RunFileError(f"{p}: given twice (same file as {q})")
        if os.path.exists(out) and os.path.samefile(p, out):
            raise RunFileError(f"{out}: is also an input; write the merged run to a new file")
        seen.append(p)


def _write(out: str, readers: list[RunReader], created: FileId) -> MergeResult:
    try:
        if file_id(out) != created:
            raise RunFileError(f"{out}: replaced by another file while it was being created")
        conn = connect_rw(out)
    except (sqlite3.Error, OSError) as exc:
        raise RunFileError(f"{out}: cannot create run file ({exc})") from None
    result = MergeResult(path=out, inputs=[r.path for r in readers], processes=0)
    try:
        conn.execute("BEGIN IMMEDIATE")
        out_cols = {t: _columns(conn, t) for t in _tables(conn)}
        redactions = [_redaction(r) for r in readers]
        conn.execute(*_run_row([r.run() for r in readers], redactions))
        skipped: set[str] = set()
        for r, redaction in zip(readers, redactions):
            remap = _copy_processes(conn, r, out_cols["processes"], redaction)
            result.processes += len(remap)
            for table in _tables(r.conn):
                if table in _SPECIAL:
                    continue
                cols = _columns(r.conn, table)
                if "proc" not in cols:
                    skipped.add(table)
                    continue
                if table not in out_cols:
                    # a table only the input knows (written by a newer memscope of the same
                    # schema version): recreate it from the input's own definition
                    sql = r.scalar("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                                   (table,))
                    conn.execute(sql)
                    out_cols[table] = _columns(conn, table)
                n = _copy_table(conn, r, table, cols, out_cols[table], remap)
                result.rows[table] = result.rows.get(table, 0) + n
        conn.execute(
            "INSERT INTO events (proc, t, step, kind, message, data) VALUES (NULL, ?, NULL, 'merged', ?, ?)",
            (time.time(), f"merged from {len(readers)} run files",
             json.dumps({"inputs": [os.path.abspath(r.path) for r in readers]})))
        conn.execute("COMMIT")
        result.skipped_tables = sorted(skipped)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.close()
        raise
    close_for_copy(conn)
    conn.close()
    return result


def _redaction(r: RunReader) -> Redaction:
    """The input's own redaction, applied again to what is copied (a file written before
    memscope redacted keeps no secret in the merged one): kept whole only where every process
    of the input was recorded with ``--no-redact``; its ``--redact`` patterns still apply."""
    options = [p["options"] for p in r.processes()]
    patterns = {str(x) for o in options for x in (o.get("redact_patterns") or ()) if isinstance(x, str)}
    kept = bool(options) and all(o.get("redact") is False for o in options)
    try:
        return Redaction(not kept, tuple(sorted(patterns)))
    except ValueError:  # a pattern that is not a regular expression: the built-in rule alone
        return Redaction(not kept)


def _run_row(runs: list[dict[str, Any] | None],
             redactions: list[Redaction]) -> tuple[str, tuple[Any, ...]]:
    present = [(r, red) for r, red in zip(runs, redactions) if r is not None]
    if not present:
        raise RunFileError("none of the inputs has a run row")
    first, redaction = present[0]
    present_runs = [r for r, _ in present]
    worst = max(present_runs, key=lambda r: _STATUS_RANK.get(r["status"], 1))
    ended = [r["ended"] for r in present_runs]
    hosts = list(dict.fromkeys(r["host"] for r in present_runs if r["host"]))
    return (
        "INSERT INTO run (id, command, cwd, host, memscope_version, started, ended, exit_code,"
        " signal, status) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (json.dumps(redaction.argv(first["command"])), first["cwd"], ",".join(hosts) or None,
         first["memscope_version"], min(r["started"] for r in present_runs),
         None if any(e is None for e in ended) else max(ended),
         worst["exit_code"], worst["signal"], worst["status"]),
    )


def _copy_processes(conn: sqlite3.Connection, r: RunReader, out_cols: list[str],
                    redaction: Redaction) -> dict[int, int]:
    cols = [c for c in _columns(r.conn, "processes") if c != "id" and c in out_cols]
    remap: dict[int, int] = {}
    sql = f"INSERT INTO processes ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"
    argv = cols.index("argv") if "argv" in cols else None
    for row in r.conn.execute(f"SELECT id, {', '.join(cols)} FROM processes ORDER BY id"):
        values = list(row)[1:]
        if argv is not None:
            values[argv] = _redacted_json(values[argv], redaction)
        cur = conn.execute(sql, values)
        remap[int(row[0])] = int(cur.lastrowid)  # type: ignore[arg-type]
    return remap


def _copy_table(conn: sqlite3.Connection, r: RunReader, table: str, cols: list[str],
                out_cols: list[str], remap: dict[int, int]) -> int:
    rowid_pk = _rowid_alias(r.conn, table)
    common = [c for c in cols if c in out_cols and c != rowid_pk]
    pos = common.index("proc")
    sql = f"INSERT INTO {_q(table)} ({', '.join(map(_q, common))}) VALUES ({', '.join('?' for _ in common)})"
    cur = r.conn.execute(f"SELECT {', '.join(map(_q, common))} FROM {_q(table)}")
    n = 0
    while True:
        chunk = cur.fetchmany(_CHUNK)
        if not chunk:
            return n
        rows = []
        for row in chunk:
            values = list(row)
            if values[pos] is not None:
                if values[pos] not in remap:  # rows of a process with no processes row: keep apart
                    raise RunFileError(f"{r.path}: table {table} has rows of process {values[pos]}, "
                                       "which the file does not list; the file is damaged")
                values[pos] = remap[values[pos]]
            rows.append(values)
        conn.executemany(sql, rows)
        n += len(rows)


def _redacted_json(text: Any, redaction: Redaction) -> Any:
    """A stored argv (a JSON list of words) redacted again; anything else as it was."""
    try:
        words = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        return text
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        return text
    return json.dumps(redaction.argv(words))


def _tables(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({_q(table)})")]


def _rowid_alias(conn: sqlite3.Connection, table: str) -> str | None:
    """An ``INTEGER PRIMARY KEY`` column: a row id, renumbered by the output, not copied."""
    info = list(conn.execute(f"PRAGMA table_info({_q(table)})"))
    pks = [r for r in info if r[5]]
    if len(pks) == 1 and str(pks[0][2]).upper() == "INTEGER":
        return str(pks[0][1])
    return None


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
