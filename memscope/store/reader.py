"""Read-only access to a run file, safe while the run is still being written.

Opens with ``mode=ro`` so a reader can never change or lock out a live run, and imports nothing
of torch: a run file copied to a laptop opens here.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import sqlite_utils

from memscope.store.schema import RunFileError, check_version


class RunReader:
    """Typed queries over one run file. Rows come back as plain dicts."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        p = Path(self.path)
        if not p.exists():
            raise RunFileError(f"{self.path}: no such file")
        if p.is_dir():
            raise RunFileError(f"{self.path}: is a directory, not a run file")
        try:
            conn = sqlite3.connect(p.resolve().as_uri() + "?mode=ro", uri=True, timeout=5.0)
        except sqlite3.Error as exc:
            raise RunFileError(f"{self.path}: cannot open ({exc})") from None
        try:
            self.version = check_version(conn, self.path)
            # Touch the tables a run must have: a truncated file fails here, not later.
            conn.execute("SELECT count(*) FROM run").fetchone()
            conn.execute("SELECT count(*) FROM steps").fetchone()
        except RunFileError:
            conn.close()
            raise
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise RunFileError(f"{self.path}: damaged or not a memscope run file ({exc})") from None
        conn.row_factory = sqlite3.Row
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

    def __enter__(self) -> "RunReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def query(self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()) -> list[dict[str, Any]]:
        try:
            return [dict(r) for r in self.conn.execute(sql, params)]
        except sqlite3.DatabaseError as exc:
            raise RunFileError(f"{self.path}: damaged run file ({exc})") from None

    def scalar(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        rows = self.query(sql, params)
        return next(iter(rows[0].values())) if rows else None

    # -- the run and its processes -------------------------------------------------------------

    def run(self) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM run WHERE id = 1")
        if not rows:
            return None
        run = rows[0]
        run["command"] = _json(run["command"], [])
        return run

    def processes(self) -> list[dict[str, Any]]:
        procs = self.query("SELECT * FROM processes ORDER BY coalesce(rank, 0), id")
        for p in procs:
            p["argv"] = _json(p["argv"], [])
            p["options"] = _json(p["options"], {})
        return procs

    # -- timelines -----------------------------------------------------------------------------

    def steps(self, proc: int | None = None) -> list[dict[str, Any]]:
        if proc is None:
            return self.query("SELECT * FROM steps ORDER BY proc, step")
        return self.query("SELECT * FROM steps WHERE proc = ? ORDER BY step", (proc,))

    def sample_count(self) -> int:
        return int(self.scalar("SELECT count(*) FROM samples") or 0)

    def samples(self, proc: int) -> Iterator[dict[str, Any]]:
        for r in self.conn.execute("SELECT * FROM samples WHERE proc = ? ORDER BY t", (proc,)):
            yield dict(r)

    def cuda_samples(self, proc: int) -> list[dict[str, Any]]:
        return self.query("SELECT * FROM cuda_samples WHERE proc = ? ORDER BY t", (proc,))

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        if kind is None:
            rows = self.query("SELECT * FROM events ORDER BY t")
        else:
            rows = self.query("SELECT * FROM events WHERE kind = ? ORDER BY t", (kind,))
        for r in rows:
            r["data"] = _json(r["data"], None)
        return rows


def _json(text: str | None, default: Any) -> Any:
    if text is None:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default
