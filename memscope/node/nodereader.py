"""Read-only access to a node file (memscope.node.nodefile), safe while a daemon writes it."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from memscope.node.nodefile import NODE_APPLICATION_ID, NODE_SCHEMA_VERSION
from memscope.store.reader import _json  # the run file's reading of a JSON column
from memscope.store.schema import RunFileError

_TABLES = ("node", "processes", "samples", "events")


class NodeReader:
    """Typed queries over one node file; rows as dicts."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        p = Path(self.path)
        if not p.exists():
            raise RunFileError(f"{self.path}: no such file")
        try:
            self.conn = sqlite3.connect(p.resolve().as_uri() + "?mode=ro", uri=True, timeout=5.0,
                                        check_same_thread=False)
        except sqlite3.Error as exc:
            raise RunFileError(f"{self.path}: cannot open ({exc})") from None
        try:
            app = int(self.conn.execute("PRAGMA application_id").fetchone()[0])
            version = int(self.conn.execute("PRAGMA user_version").fetchone()[0])
            if app != NODE_APPLICATION_ID:
                raise RunFileError(f"{self.path}: not a memscope node file")
            if version > NODE_SCHEMA_VERSION:
                raise RunFileError(f"{self.path}: written by a newer memscope (node schema {version}); "
                                   "upgrade memscope to read it")
            have = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            missing = [t for t in _TABLES if t not in have]
            if missing:
                raise RunFileError(f"{self.path}: damaged node file (no {missing[0]} table)")
            self.conn.execute("SELECT count(*) FROM samples").fetchone()
        except RunFileError:
            self.conn.close()
            raise
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise RunFileError(f"{self.path}: damaged or not a memscope node file ({exc})") from None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "NodeReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        try:
            cur = self.conn.execute(sql, params)
            names = [d[0] for d in cur.description or ()]
            return [dict(zip(names, r)) for r in cur.fetchall()]
        except sqlite3.DatabaseError as exc:
            raise RunFileError(f"{self.path}: damaged node file ({exc})") from None

    def node(self) -> dict[str, Any]:
        rows = self.query("SELECT * FROM node WHERE id = 1")
        if not rows:
            raise RunFileError(f"{self.path}: damaged node file (no node row)")
        node = rows[0]
        node["options"] = _json(node.get("options"), {})
        return node

    def processes(self) -> list[dict[str, Any]]:
        rows = self.query("SELECT * FROM processes ORDER BY first_seen, id")
        for r in rows:
            argv = _json(r.get("command"), [])
            r["argv"] = [str(a) for a in argv] if isinstance(argv, list) else []
        return rows

    def samples(self, proc: int, since: float | None = None) -> list[dict[str, Any]]:
        if since is None:
            return self.query("SELECT * FROM samples WHERE proc = ? ORDER BY t", (proc,))
        return self.query("SELECT * FROM samples WHERE proc = ? AND t_end >= ? ORDER BY t", (proc, since))

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        if kind is None:
            rows = self.query("SELECT * FROM events ORDER BY t, id")
        else:
            rows = self.query("SELECT * FROM events WHERE kind = ? ORDER BY t, id", (kind,))
        for r in rows:
            data = _json(r.get("data"), None)
            r["data"] = data if isinstance(data, dict) else None
        return rows

