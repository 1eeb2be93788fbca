"""Read-only access to a run file, safe while the run is still being written.

Opens with ``mode=ro`` so a reader can never change or lock out a live run, and imports nothing
of torch: a run file copied to a laptop opens here.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

if TYPE_CHECKING:
    import sqlite_utils

from memscope.store.liveness import is_abandoned
from memscope.store import spill
from memscope.store.column_guard import ColumnGuard
from memscope.store.schema import RunFileError, check_tables, check_version, expected_tables


class RunReader:
    """Typed queries over one run file. Rows come back as plain dicts."""

    def __init__(self, path: str | os.PathLike[str], threads: bool = False) -> None:
        """``threads``: the reader may be used from threads other than the one that opened it,
        one at a time (a dashboard keeps one open between refreshes on worker threads)."""
        self.path = str(path)
        p = Path(self.path)
        if not p.exists():
            raise RunFileError(f"{self.path}: no such file")
        if p.is_dir():
            raise RunFileError(f"{self.path}: is a directory, not a run file")
        if not os.access(p, os.R_OK):  # (another user's private run file: 0600 by default)
            raise RunFileError(f"{self.path}: not readable by this user (permission denied)")
        try:
            conn = sqlite3.connect(p.resolve().as_uri() + "?mode=ro", uri=True, timeout=5.0,
                                   check_same_thread=not threads)
        except sqlite3.Error as exc:
            raise RunFileError(f"{self.path}: cannot open ({exc})") from None
        try:
            self.version = check_version(conn, self.path)
            check_tables(conn, self.path, self.version)
            # Touch the tables a run must have: a truncated file fails here, not later.
            conn.execute("SELECT count(*) FROM run").fetchone()
            conn.execute("SELECT count(*) FROM steps").fetchone()
        except RunFileError:
            conn.close()
            raise
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            conn.close()
            raise RunFileError(f"{self.path}: damaged or not a memscope run file ({exc})") from None
        self.conn = conn
        # every column a query reads is checked before its rows are used (column_guard.py)
        self.guard = ColumnGuard(conn, self.path)
        self._db: "sqlite_utils.Database | None" = None

    @property
    def db(self) -> "sqlite_utils.Database":
        """The file as a sqlite-utils Database, for ad-hoc queries (``reader.db["steps"].rows``).

        Imported on first use: the reports themselves need only sqlite3.
        """
        if self._db is None:
            import sqlite_utils

            self._db = sqlite_utils.Database(self.conn)
        return self._db

    def close(self) -> None:
        self.conn.close()

    @contextlib.contextmanager
    def consistent(self) -> Iterator[None]:
        """Every query inside reads one state of the file (a read transaction): what a live
        writer commits meanwhile shows in the next one, never half in this one."""
        if self.conn.in_transaction:
            yield
            return
        self.conn.execute("BEGIN")
        try:
            yield
        finally:
            self.conn.rollback()  # read-only: nothing to keep

    def __enter__(self) -> "RunReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def unchecked(self) -> Iterator[None]:
        """Queries inside read values as they are, their columns not checked (a raw dump, an
        export that checks each chunk in its own query)."""
        recording, self.guard.recording = self.guard.recording, False
        try:
            yield
        finally:
            self.guard.recording = recording

    def check_tables(self, tables: Sequence[str] | None = None) -> None:
        """Check every column of ``tables`` (all the file's) now: RunFileError names the first
        damaged value (a command that copies or dumps whole tables)."""
        self.guard.check_tables(tables if tables is not None else list(expected_tables(self.version)))

    def query(self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()) -> list[dict[str, Any]]:
        """Rows as dicts, every column the query read checked against its rule first (a damaged
        file raises RunFileError with one line, never a TypeError deep in an analysis or a
        wrong figure)."""
        names, rows = self._fetch(sql, params)
        return [dict(zip(names, r)) for r in rows]

    def rows(self, sql: str, params: tuple[Any, ...] = (), chunk: int = 5000,
             checked: bool = True) -> Iterator[tuple[Any, ...]]:
        """Checked rows as tuples, fetched in chunks: for long scans (exports). ``checked=False``
        passes values as they are (a raw table dump), text that is not UTF-8 still replaced."""
        for batch in self.batches(sql, params, chunk, checked):
            yield from batch

    def batches(self, sql: str, params: tuple[Any, ...] = (), chunk: int = 5000,
                checked: bool = True) -> Iterator[list[tuple[Any, ...]]]:
        """:meth:`rows` a list of up to ``chunk`` at a time: a caller that formats a block at once
        (an export of a million rows) pays no Python step per row here."""
        done = 0
        try:
            cur = self._execute(sql, params, checked)
            while True:
                batch = cur.fetchmany(chunk)
                if not batch:
                    return
                yield batch
                done += len(batch)
        except UnicodeDecodeError:
            # flipped bytes in a text value: read the rest again, replacing what is not UTF-8
            _, again = self._fetch(sql, params, checked)
            for i in range(done, len(again), chunk):
                yield again[i:i + chunk]
        except sqlite3.DatabaseError as exc:
            raise RunFileError(f"{self.path}: damaged run file ({exc})") from None

    def columns(self, table: str) -> list[str]:
        """The columns of ``table``, in order."""
        return [r["name"] for r in self.query(f'PRAGMA table_info("{table.replace(chr(34), chr(34) * 2)}")')]

    def _fetch(self, sql: str, params: Any, checked: bool = True) -> tuple[list[str], list[tuple[Any, ...]]]:
        try:
            try:
                cur = self._execute(sql, params, checked)
                rows = cur.fetchall()
            except UnicodeDecodeError:
                # flipped bytes in a text value: read it again, replacing what is not UTF-8
                self.conn.text_factory = _lenient_text
                try:
                    cur = self._execute(sql, params, checked)
                    rows = cur.fetchall()
                finally:
                    self.conn.text_factory = str
        except sqlite3.DatabaseError as exc:
            raise RunFileError(f"{self.path}: damaged run file ({exc})") from None
        return [d[0] for d in cur.description or ()], rows

    def _execute(self, sql: str, params: Any, checked: bool) -> sqlite3.Cursor:
        """The statement started, every column it reads checked first (unless ``checked`` is
        False); an error SQLite raises on a damaged value (an overflow in a sum) is named by
        the check when it can be."""
        try:
            if checked:
                cur = self.conn.execute(sql, params)
                try:
                    self.guard.check()
                except BaseException:
                    cur.close()  # its statement would keep the file open after close()
                    raise
            else:
                with self.unchecked():
                    cur = self.conn.execute(sql, params)
        except sqlite3.DatabaseError:
            if checked:
                self.guard.check()
            raise
        cur.row_factory = None
        return cur

    def scalar(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        rows = self.query(sql, params)
        return next(iter(rows[0].values())) if rows else None

    # -- the run and its processes -------------------------------------------------------------

    def run(self) -> dict[str, Any] | None:
        """The run row; ``status`` is ``abandoned`` when it says running but no writer is left
        (the stored word is kept in ``stored_status``)."""
        rows = self.query("SELECT * FROM run WHERE id = 1")
        if not rows:
            return None
        run = rows[0]
        run["command"] = _strings(_json(run["command"], []))
        if not isinstance(run["status"], str) or not run["status"]:
            raise RunFileError(f"{self.path}: damaged run file: the run has no status")
        if not isinstance(run["started"], (int, float)):
            raise RunFileError(f"{self.path}: damaged run file: the run has no start time")
        run["stored_status"] = run["status"]
        if run["status"] == "running" and is_abandoned(run, self.processes(), self.last_activity):
            run["status"] = "abandoned"
        return run

    def last_activity(self) -> float | None:
        """The newest sign of a writer: a heartbeat, a memory sample, a process start."""
        beats = "max(heartbeat)" if self.version >= 5 else "NULL"
        row = self.query(f"SELECT {beats} AS h, max(started) AS s FROM processes")[0]
        procs = [r["id"] for r in self.query("SELECT id FROM processes")]
        times = [row["h"], row["s"]]
        for proc in procs:  # the (proc, t) index makes each max() a lookup
            times.append(self.scalar("SELECT max(t) FROM samples WHERE proc = ?", (proc,)))
        for spilled in self._spill_files():  # touched by a writer a lock holds off
            try:
                times.append(os.lstat(spilled).st_mtime)
            except OSError:
                pass
        found = [float(x) for x in times if isinstance(x, (int, float))]
        return max(found) if found else None

    def _spill_files(self) -> list[str]:
        """The spill files this run's writers made (a file planted beside it is no sign of
        life); every file named like one in a file older than the record of them."""
        if self.version < 11:
            return spill.spill_files(self.path)
        return [sf.path for sf in (spill.verify(self.path, rec)[0] for rec in spill.recorded(self.conn))
                if sf is not None]

    def wal_pending(self) -> int:
        """Bytes in a ``-wal`` file beside a run that has ended: that file belongs to the run
        (copy both), as the checkpoint that folds it in did not happen."""
        try:
            return os.path.getsize(self.path + "-wal")
        except OSError:
            return 0

    def processes(self) -> list[dict[str, Any]]:
        procs = self.query("SELECT * FROM processes ORDER BY coalesce(rank, 0), id")
        for p in procs:
            p["argv"] = _strings(_json(p["argv"], []))
            options = _json(p["options"], {})
            p["options"] = options if isinstance(options, dict) else {}
        return procs

    # -- timelines -----------------------------------------------------------------------------

    def steps(self, proc: int | None = None) -> list[dict[str, Any]]:
        if proc is None:
            rows = self.query("SELECT * FROM steps ORDER BY proc, step")
        else:
            rows = self.query("SELECT * FROM steps WHERE proc = ? ORDER BY step", (proc,))
        return rows

    def step_windows(self, proc: int | None = None) -> list[dict[str, Any]]:
        """Steps the writer folded (memscope/store/fold.py), one row per window; none in files
        before schema 10 or runs too short to fold."""
        if self.version < 10:
            return []
        if proc is None:
            return self.query("SELECT * FROM step_windows ORDER BY proc, first_step")
        return self.query("SELECT * FROM step_windows WHERE proc = ? ORDER BY first_step", (proc,))

    def folded_steps(self) -> dict[int, int]:
        """{proc: completed steps folded into windows} (steps the ``steps`` table no longer holds)."""
        if self.version < 10:
            return {}
        return {int(r["proc"]): int(r["n"]) for r in
                self.query("SELECT proc, sum(steps) AS n FROM step_windows GROUP BY proc")}

    def sample_count(self) -> int:
        return int(self.scalar("SELECT count(*) FROM samples") or 0)

    def samples(self, proc: int) -> Iterator[dict[str, Any]]:
        names = ("proc", "t", "step", "phase", "rss")
        for r in self.rows(f"SELECT {', '.join(names)} FROM samples WHERE proc = ? ORDER BY t", (proc,)):
            yield dict(zip(names, r))

    def cuda_samples(self, proc: int) -> list[dict[str, Any]]:
        return self.query("SELECT * FROM cuda_samples WHERE proc = ? ORDER BY t", (proc,))

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        if kind is None:
            rows = self.query("SELECT * FROM events ORDER BY t")
        else:
            rows = self.query("SELECT * FROM events WHERE kind = ? ORDER BY t", (kind,))
        for r in rows:
            data = _json(r["data"], None)
            r["data"] = data if isinstance(data, dict) else None
        return rows


def _json(text: Any, default: Any) -> Any:
    if not isinstance(text, str):
        return default
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return default


def _strings(value: Any) -> list[str]:
    """A JSON list of words (a command, an argv); anything else is damaged: empty."""
    if not isinstance(value, list):
        return []
    return [v if isinstance(v, str) else json.dumps(v) for v in value]


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")
