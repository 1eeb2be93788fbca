"""Every column a reader's query reads is checked against its rule before the rows are used.

SQLite tells which tables a statement reads while it prepares it (its authorizer callback:
``SQLITE_READ`` with the table and column, for every column a SELECT, a WHERE, an ORDER BY or
an aggregate touches, whatever SQL an analysis writes). :class:`ColumnGuard` keeps that list for
its connection and, before :class:`memscope.store.reader.RunReader` hands out a query's rows,
checks every column of each table read so far against :mod:`memscope.store.column_rules`, in
one SQL pass per table: a NULL where a value is required, a value of another type, a number
out of its range. The first damaged value found raises :class:`RunFileError` with one line
naming it.

Each table is checked once per reader; a live file (another connection committed since, as
``PRAGMA data_version`` says) gets its new rows checked (by rowid; the run and process rows,
which writers update in place, whole). A table no query reads is never checked: a reader whose
figures do not use it prints what it would print for the undamaged file.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Iterable

from memscope.store.column_rules import Rule, rules
from memscope.store.schema import RunFileError

_UPDATED_IN_PLACE = frozenset({"run", "processes"})  # writers UPDATE these rows


class ColumnGuard:
    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self.conn = conn
        self.path = path
        self.recording = True  # False while a query reads values unchecked (a raw dump), or checks
        self._rules = rules()
        self._read: set[str] = set()  # tables statements read, not yet checked
        self._done: dict[str, int] = {}  # table -> the rowid its rows are checked up to
        self._data_version: int | None = None
        conn.set_authorizer(self._authorize)

    def _authorize(self, action: int, table: str | None, column: str | None, _db: Any, _src: Any) -> int:
        if action == sqlite3.SQLITE_READ and self.recording and table and table not in self._done:
            self._read.add(table)
        return sqlite3.SQLITE_OK

    def check(self) -> None:
        """Check the tables the queries so far read (new tables; new rows of a live file)."""
        recording, self.recording = self.recording, False
        try:
            version = self.conn.execute("PRAGMA data_version").fetchone()[0]
            changed = version != self._data_version
            if not self._read and not changed:
                return
            tables = {t for t in self._read if t in self._rules}
            self._read = set()
            if changed:
                tables |= set(self._done)
            for table in sorted(tables):
                self._check_table(table)
            self._data_version = version
        except sqlite3.DatabaseError as exc:
            raise RunFileError(f"{self.path}: damaged run file ({exc})") from None
        finally:
            self.recording = recording

    def check_tables(self, tables: Iterable[str]) -> None:
        """Check ``tables`` now (a command that copies or dumps them whole); those an older
        schema's file lacks are none of its rows (the reader's structure check names a table
        missing from the file's own schema)."""
        try:
            present = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            raise RunFileError(f"{self.path}: damaged run file ({exc})") from None
        self._read.update(t for t in tables if t in present)
        self.check()

    def _check_table(self, table: str) -> None:
        top = int(self.conn.execute(f'SELECT coalesce(max(rowid), 0) FROM "{table}"').fetchone()[0])
        checked_to = self._done.get(table, 0)
        if top < checked_to or table in _UPDATED_IN_PLACE:
            checked_to = 0  # rows rewritten (or removed from the end): all of them again
        if top > checked_to:
            self._scan(table, checked_to, top)
        self._done[table] = top

    def _scan(self, table: str, low: int, high: int) -> None:
        have = {r[1].decode() if isinstance(r[1], bytes) else r[1]  # (an export's text_factory)
                for r in self.conn.execute(f'PRAGMA table_info("{table}")')}
        checks = [r for c, r in self._rules[table].items() if c in have]  # an older schema's file
        if not checks:
            return
        oks = [r.ok_sql() for r in checks]
        # the row found says, in the same query, which column breaks its rule and what it holds
        # (a second lookup by rowid can miss on a damaged b-tree)
        said = ", ".join(f"{ok}, typeof({_q(r.column)}), {_shown(r.column)}" for ok, r in zip(oks, checks))
        row = self.conn.execute(f'SELECT rowid, {said} FROM "{table}" WHERE rowid > ? AND rowid <= ? '
                                f"AND NOT ({' AND '.join(oks)}) LIMIT 1", (low, high)).fetchone()
        if row is not None:
            raise RunFileError(f"{self.path}: damaged run file: {_describe(table, checks, row)}")


def _q(column: str) -> str:
    return f'"{column}"'


def _shown(column: str) -> str:
    """What the line shows of a value: a number as it is, text's first bytes (hex, decoded in
    Python: they may not be UTF-8), a blob's length."""
    c = _q(column)
    return (f"CASE typeof({c}) WHEN 'text' THEN hex(substr(CAST({c} AS BLOB), 1, 24)) "
            f"WHEN 'blob' THEN length({c}) ELSE {c} END")


def _describe(table: str, checks: list[Rule], row: tuple[Any, ...]) -> str:
    """The first column of the row found that breaks its rule, in words."""
    rowid, rest = row[0], row[1:]
    for i, rule in enumerate(checks):
        ok, kind, value = rest[3 * i:3 * i + 3]
        if ok:
            continue
        if isinstance(kind, bytes):  # read under an export's text_factory
            kind = kind.decode()
        if kind == "text":
            hexed = value.decode() if isinstance(value, bytes) else str(value)
            value = bytes.fromhex(hexed).decode("utf-8", "replace")[:20]
        why = rule.problem(kind, value) or "holds a value its column cannot hold"
        return f"{table}.{rule.column} {why} (row {rowid})"
    return f"{table}: row {rowid} holds a value its columns cannot hold"
