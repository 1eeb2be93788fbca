"""Read-only access to a run file, safe while the run is still being written.

Opens with ``mode=ro`` so a reader can never change or lock out a live run, and imports nothing
of torch: a run file copied to a laptop opens here.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

if TYPE_CHECKING:
    import sqlite_utils

from memscope.store.liveness import is_abandoned
from memscope.store import spill
from memscope.store.schema import SCHEMA_VERSION, RunFileError, check_tables, check_version, expected_tables


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

    def query(self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()) -> list[dict[str, Any]]:
        """Rows as dicts, their values checked against the schema's column types (a damaged
        file raises RunFileError with one line, never a TypeError deep in an analysis)."""
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
            cur = self.conn.execute(sql, params)
            cur.row_factory = None
            names = [d[0] for d in cur.description or ()]
            check = self._checker(names if checked else [])
            while True:
                batch = cur.fetchmany(chunk)
                if not batch:
                    return
                check(batch)
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
                cur = self.conn.execute(sql, params)
                cur.row_factory = None
                rows = cur.fetchall()
            except UnicodeDecodeError:
                # flipped bytes in a text value: read it again, replacing what is not UTF-8
                self.conn.text_factory = _lenient_text
                try:
                    cur = self.conn.execute(sql, params)
                    cur.row_factory = None
                    rows = cur.fetchall()
                finally:
                    self.conn.text_factory = str
        except sqlite3.DatabaseError as exc:
            raise RunFileError(f"{self.path}: damaged run file ({exc})") from None
        names = [d[0] for d in cur.description or ()]
        self._checker(names if checked else [])(rows)
        return names, rows

    def _checker(self, names: Sequence[str]) -> Any:
        checks = [(i, _ACCEPT[n], n, _BOUNDS.get(n)) for i, n in enumerate(names) if n in _ACCEPT]
        path = self.path

        def check(rows: list[tuple[Any, ...]]) -> None:
            for row in rows:
                for i, ok, name, bound in checks:
                    v = row[i]
                    if v is None:
                        continue
                    if type(v) not in ok or (type(v) is float and not math.isfinite(v)):
                        raise RunFileError(f"{path}: damaged run file: column {name} holds "
                                           f"{_kind(v)}, not {_WANT[name]}")
                    if bound is not None and not -bound <= v <= bound:
                        raise RunFileError(f"{path}: damaged run file: column {name} holds "
                                           f"{v!r}, out of any plausible range")
                    if name == "shape" and not _shape_ok(v):
                        raise RunFileError(f"{path}: damaged run file: column shape holds "
                                           f"{_kind(v)}, not a JSON list of sizes")
        return check

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

    def _required(self, rows: list[dict[str, Any]], table: str,
                  columns: tuple[str, ...]) -> list[dict[str, Any]]:
        """The schema says NOT NULL and SQLite enforced it on write: a NULL read back is a
        damaged record (flipped bits in its header)."""
        for r in rows:
            for c in columns:
                if r.get(c) is None:
                    raise RunFileError(f"{self.path}: damaged run file: a {table} row has no {c}")
        return rows

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
        procs = self._required(self.query("SELECT * FROM processes ORDER BY coalesce(rank, 0), id"),
                               "processes", ("id", "pid", "started", "status"))
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
        return self._required(rows, "steps", ("proc", "step", "start", "end", "status"))

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
        for r in self._required(rows, "events", ("t", "kind")):
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


@functools.lru_cache(maxsize=4096)
def _shape_ok(text: str) -> bool:
    """A tensor shape as the agent writes it: a short JSON list of sizes (``[64, 2048]``)."""
    if len(text) > 1000:
        return False
    try:
        shape = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(shape, list) and len(shape) <= 64 and all(
        type(d) is int and 0 <= d <= _COUNT for d in shape)


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _kind(v: Any) -> str:
    if isinstance(v, bytes):
        return f"a blob of {len(v)} bytes"
    if isinstance(v, str):
        return f"text {v[:20]!r}"
    return repr(v)


def _accepted() -> tuple[dict[str, tuple[type, ...]], dict[str, str]]:
    """Column name -> Python types its values may have, from every table of the schema.
    A name used with two types (``device``: a CUDA index or 'cuda:0') accepts both."""
    by_type = {"INTEGER": (int,), "REAL": (float, int), "TEXT": (str,)}
    accept: dict[str, set[type]] = {}
    for columns in expected_tables(SCHEMA_VERSION).values():
        for name, (declared, _notnull) in columns.items():
            accept.setdefault(name, set()).update(by_type.get(declared, (int, float, str)))
    want = {n: " or ".join(sorted({"INTEGER" if t is int else "REAL" if t is float else "TEXT"
                                   for t in ts})) for n, ts in accept.items()}
    return {n: tuple(ts) for n, ts in accept.items()}, want


_ACCEPT, _WANT = _accepted()
# Beyond these a value is damage, not a run: counts an analysis loops over (2**40 steps is 35
# years at one step a millisecond), times a calendar can show (year 33658), durations (30 years).
_COUNT, _TIME, _DURATION = 2 ** 40, 1e12, 1e9
_BOUNDS: dict[str, float] = {
    **dict.fromkeys(("step", "proc", "calls", "count", "tensors", "saved_tensors", "rank",
                     "local_rank", "world_size", "version", "id", "pid", "owner_pid", "exit_code",
                     "signal", "samples", "dropped", "truncated", "requires_grad",
                     "micro_batches"), _COUNT),
    **dict.fromkeys(("t", "start", "end", "started", "ended", "heartbeat", "applied"), _TIME),
    **dict.fromkeys(("forward_s", "backward_s", "duration_s"), _DURATION),
}
