"""A table's CSV line in SQL, typed where a chunk's values allow it (csv_export's table files).

The line for any value (:func:`memscope.report.sql_text.csv_line`) asks each cell's type per row
(a CASE over ``typeof()``) and makes a REAL's text in a printf inside the line's printf. A run
file's chunks nearly always hold what the schema declares, so a cheaper line is tried first,
which writes such values byte for byte as that one does:

* an INTEGER column: the value itself through printf's ``%s`` (a NULL: empty);
* a REAL column: ``%!.18g`` in the line's own printf (NOT NULL), or the nested printf without
  the type CASE (nullable);
* any other column: a value among the column's plain words (the commonest text of its first
  chunk made only of ``[A-Za-z0-9_.]``: nothing to quote or guard) as it is, else as any value;
* first of all, a number column with no value in the first chunk: an empty cell, no argument.

A row whose text values are all plain words (or NULL), and whose seldom NULL REALs (a nullable
REAL column with a value in 3/4 of the first chunk's rows) are not NULL, is one printf: each
``||`` would copy the line so far (steps, samples, layer_stats: 13-18% less CPU at 1M steps). A
word is matched as text only (``+column``: no TEXT affinity, which would make the REAL 0.1 equal
to the word ``0.1``); any other row is made by the cells above.

Its condition, an aggregate over the chunk in the same query (joined_chunks' ``check``), holds
only when every INTEGER value is an integer or NULL (``sum()`` is an integer: a REAL, text or
blob makes it REAL; an overflow is an error, taken as failing) and every REAL value a REAL, not
NULL where declared NOT NULL (their maximum is a REAL: text and blobs sort above numbers; a REAL
column's affinity makes any number a REAL), and the empty cells' columns NULL. A chunk that fails
it is made by the next line (the typed line with every number column, then the line for any
value), and so is every chunk after it (``fallback``).
"""

from __future__ import annotations

import re
import sqlite3
from typing import NamedTuple

from memscope.report import sql_text
from memscope.report.sql_text import REAL_TEXT, csv_cell, printf_line
from memscope.store.reader import RunReader

PLAIN = re.compile(rb"[A-Za-z0-9_.]+")  # no CSV quoting, no formula guard: written as it is
WORDS = 64  # plain words per column at most (an IN list: a lookup per row)


class Column(NamedTuple):
    name: str  # quoted
    declared: str  # its declared type, upper case
    not_null: bool


class TypedLine(NamedTuple):
    line: str
    check: str
    columns: tuple[str, ...]  # those the check reads
    params: dict[str, str]  # the plain words, bound


def columns_of(reader: RunReader, table: str) -> list[Column]:
    """``table``'s columns as the file declares them, in order (``table`` quoted)."""
    return [Column('"' + str(name).replace('"', '""') + '"', str(declared or "").upper(), bool(not_null))
            for _, name, declared, not_null, *_ in reader.conn.execute(f"PRAGMA table_info({table})")]


def typed_lines(reader: RunReader, table: str, columns: list[Column]) -> list[TypedLine]:
    """The typed lines of ``table`` (quoted) to try in turn: the first with the number columns
    that are NULL throughout the first chunk as constant empty cells (steps' CUDA columns on a
    CPU run), if any; none for a one-column table (its empty line is spelled ``""``: the line
    for any value handles it)."""
    if len(columns) < 2:
        return []
    # each text column's plain words, read once for both lines
    words = {c.name: _plain_words(reader, table, c.name) for c in columns if c.declared not in ("INTEGER", "REAL")}
    nulls, dense = _null_columns(reader, table, columns)
    typed = typed_line(reader, table, columns, words=words, dense=dense)
    return [typed_line(reader, table, columns, nulls, words, dense), typed] if nulls else [typed]


def typed_line(reader: RunReader, table: str, columns: list[Column], nulls: tuple[str, ...] = (),
               words: dict[str, list[str]] | None = None, dense: tuple[str, ...] = ()) -> TypedLine:
    """The typed line of ``table`` (quoted) and its condition; ``nulls``: number columns written
    as empty cells, the condition that they are NULL in the chunk (one aggregate for them all);
    ``words``: each text column's plain words (read from the table when not given); ``dense``:
    nullable REAL columns seldom NULL, through the row's one printf where not NULL."""
    cells: list[tuple[str | None, str]] = []
    fast: list[tuple[str | None, str]] = []  # the cells when every text value is a plain word (or NULL)
    plain_rows: list[str] = []  # that condition, a test per text column with words (and dense REAL)
    checks = [f"count(coalesce({', '.join(nulls)}, NULL)) = 0"] if nulls else []
    params: dict[str, str] = {}
    for i, c in enumerate(columns):
        q = c.name
        if q in nulls:
            cells.append(("", ""))
        elif c.declared == "INTEGER":
            cells.append(("%s", q))
            checks.append(f"typeof(sum({q})) IN ('integer', 'null')")
        elif c.declared == "REAL" and c.not_null:
            cells.append(("%!.18g", q))
            checks.append(f"count({q}) = count(*) AND typeof(max({q})) = 'real'")
        elif c.declared == "REAL":
            cells.append(("%s", f"CASE WHEN {q} IS NOT NULL THEN {REAL_TEXT.format(q)} END"))
            checks.append(f"typeof(max({q})) IN ('real', 'null')")
            if q in dense:  # a REAL there (the check): as a NOT NULL one
                fast.append(("%!.18g", q))
                plain_rows.append(f"{q} IS NOT NULL")
                continue
        else:
            names = []
            plain = words[q] if words is not None and q in words else _plain_words(reader, table, q)
            for j, word in enumerate(plain):
                params[f"w{i}_{j}"] = word
                names.append(f":w{i}_{j}")
            any_value = csv_cell(q)
            member = f"+{q} COLLATE BINARY IN ({', '.join(names)})"
            cells.append((None, f"CASE WHEN {member} THEN {q} ELSE {any_value} END" if names else any_value))
            if names:  # a word (or NULL) goes through the printf: no NUL in it to end it there
                fast.append(("%s", q))
                plain_rows.append(member if c.not_null else f"({q} IS NULL OR {member})")
                continue
        fast.append(cells[-1])
    checked = tuple(c.name for c in columns if c.declared in ("INTEGER", "REAL"))
    line = printf_line(cells)
    if plain_rows:  # a row of plain words: one printf (each || copies the line so far)
        line = f"CASE WHEN {' AND '.join(plain_rows)} THEN {printf_line(fast)} ELSE {line} END"
    return TypedLine(line, " AND ".join(checks) or "1", checked, params)


def _null_columns(reader: RunReader, table: str, columns: list[Column]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The number columns with no value in the table's first chunk (which has rows), and the
    nullable REAL columns with a value in at least 3/4 of its rows."""
    numbers = [c.name for c in columns if c.declared in ("INTEGER", "REAL")]
    if not numbers:
        return (), ()
    try:
        n, *counts = reader.conn.execute(
            f"SELECT count(*), {', '.join(f'count({q})' for q in numbers)} FROM"
            f" (SELECT {', '.join(numbers)} FROM {table} ORDER BY rowid LIMIT ?)", (sql_text.CHUNK,)).fetchone()
    except sqlite3.DatabaseError:  # a damaged page: the line for any value meets it
        return (), ()
    nullable_reals = {c.name for c in columns if c.declared == "REAL" and not c.not_null}
    return (tuple(q for q, k in zip(numbers, counts) if n and k == 0),
            tuple(q for q, k in zip(numbers, counts) if q in nullable_reals and n and 4 * k >= 3 * n))


def _plain_words(reader: RunReader, table: str, column: str) -> list[str]:
    """The commonest plain text values of ``column`` in the table's first chunk."""
    conn = reader.conn
    previous, conn.text_factory = conn.text_factory, bytes  # checked here, as bytes
    try:
        found = conn.execute(
            f"SELECT v FROM (SELECT {column} AS v FROM {table} ORDER BY rowid LIMIT ?)"
            " WHERE typeof(v) = 'text' AND length(v) <= 64 AND NOT instr(v, char(0))"
            " AND v NOT GLOB '*[^A-Za-z0-9_.]*' GROUP BY v ORDER BY count(*) DESC, v LIMIT ?",
            (sql_text.CHUNK, WORDS)).fetchall()
    except sqlite3.DatabaseError:  # a damaged page: the line for any value meets it
        return []
    finally:
        conn.text_factory = previous
    # the SQL filter is a shortcut; this is the rule (GLOB stops at a NUL, for one)
    return [v.decode("ascii") for v, in found if isinstance(v, bytes) and PLAIN.fullmatch(v)]
