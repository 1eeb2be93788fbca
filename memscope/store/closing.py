"""A connection whose statements finish at once: every ``execute`` fetches its rows and closes
its cursor before returning.

Why: a cursor object that something else still references keeps its statement "in progress",
and SQLite then refuses COMMIT for the whole transaction ("cannot commit transaction - SQL
statements in progress"). In a training process another thread's ``gc.get_objects()`` list
(memscope's own tensor inventory, or the user's code) can hold a cursor we already dropped, for
as long as that thread keeps the list: a run file lost its migration, and with it every row, in
about 1 open in 10 under ``memscope.profile()``. Writing connections (``connect_rw``) use this
class; results are small there (pragmas, counts, one row), so fetching them whole costs nothing.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Iterable, Iterator, Sequence


class Done:
    """The rows of a statement that already finished (what callers read off a cursor)."""

    __slots__ = ("_rows", "_next", "rowcount", "lastrowid")

    def __init__(self, rows: list[Any], rowcount: int, lastrowid: int | None) -> None:
        self._rows = rows
        self._next = 0
        self.rowcount = rowcount
        self.lastrowid = lastrowid

    def fetchone(self) -> Any:
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def fetchall(self) -> list[Any]:
        rest, self._next = self._rows[self._next:], len(self._rows)
        return rest

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    def close(self) -> None:
        pass


class ClosingConnection(sqlite3.Connection):
    """``sqlite3.connect(..., factory=ClosingConnection)``: ``execute`` and ``executemany`` return
    :class:`Done` (fetchone, fetchall, iteration, rowcount, lastrowid) with the cursor closed."""

    def execute(self, sql: str, parameters: Sequence[Any] | dict[str, Any] = (), /) -> Any:  # type: ignore[override]
        cur = self.cursor()
        try:
            cur.execute(sql, parameters)
            return Done(cur.fetchall(), cur.rowcount, cur.lastrowid)
        finally:
            cur.close()

    def executemany(self, sql: str, seq: Iterable[Any], /) -> Any:
        cur = self.cursor()
        try:
            cur.executemany(sql, seq)
            return Done([], cur.rowcount, cur.lastrowid)
        finally:
            cur.close()
