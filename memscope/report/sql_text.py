"""Export text made by SQLite: each row's text built in SQL, a chunk of rows joined there too, so
Python only moves big strings (a million rows cost no Python step each).

    for text, n in joined_chunks(reader, "printf('%d', step)", "steps", "proc = :proc",
                                 ("step",), {"proc": 1}, sep=",\\n"):
        write_chunk(out, text)

Chunks follow a key (the columns the rows are ordered by, unique together: ``("t", "rowid")``,
``("step",)``, ``("rowid",)``); each chunk starts after the last key of the one before, found
by an index walk, so a chunk costs its own rows only. A chunk comes as bytes: ASCII (nearly
always) goes to the file as it is; other text is decoded, U+FFFD in place of bytes that are not
UTF-8 (a damaged file), as :data:`lenient_text` reads it.

SQLite's float text is not Python's: ``printf('%.3f')`` rounds a tie away from zero (Python's
``round`` to even) and SQLite before 3.43 computes digits in long double, so a value within
about 2e-5 of a half unit may round the other way; ``printf('%!.18g')`` (18 significant digits)
parses back to the same double, checked once per process by :func:`floats_round_trip`.
"""

from __future__ import annotations

import functools
import random
import sqlite3
import struct
from typing import Any, Iterator, TextIO

from memscope.store.reader import RunReader, _lenient_text

lenient_text = _lenient_text  # bytes -> str, U+FFFD for what is not UTF-8
CHUNK = 16384  # rows joined by SQLite into one string (about 1.5 MB of trace events)
REAL_TEXT = "printf('%!.18g', {})"  # a REAL's text that parses back to the same double
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet evaluates such a cell
CSV_SPECIAL = '*[,"\n\r]*'  # GLOB: a cell holding one of these is quoted


class Unchecked(Exception):
    """A chunk failed its ``check`` (or SQLite refused it): read on through RunReader's checks,
    from the rows after ``after`` (a key; None: from the first row), which name the damage."""

    def __init__(self, after: tuple[Any, ...] | None) -> None:
        super().__init__(after)
        self.after = after


def joined_chunks(reader: RunReader, line: str, source: str, where: str, key: tuple[str, ...],
                  params: dict[str, Any], sep: str, check: str = "1", columns: tuple[str, ...] = (),
                  rows: int = 0, fallback: tuple[tuple[str, str], ...] = (),
                  own_rowid: bool = False) -> Iterator[tuple[bytes, int]]:
    """(text, rows) per chunk of ``SELECT line FROM source WHERE where ORDER BY key``: the rows'
    ``line`` texts joined by ``sep``, as UTF-8 bytes (:func:`write_chunk` writes them).
    Every column the chunks read is checked by the reader's guard before the first chunk is
    yielded (a damaged value: RunFileError, one line). ``check`` is an aggregate condition over
    the chunk's ``columns`` (a typed line's fit); a chunk that fails it, or that SQLite cannot
    read, raises :class:`Unchecked` before anything of it is yielded. ``line``,
    ``source``, ``where`` and ``check`` are SQL from this package (never from the file);
    ``params`` binds their ``:names``. ``rows``: per chunk (0: :data:`CHUNK`). ``fallback``:
    other (line, check) pairs, tried in order on the same chunk when the one before fails (the
    failed one is not tried again); :class:`Unchecked` when the last one fails.

    ``own_rowid``: ``rowid`` in ``key`` is the table's own (no column of ``source`` has its
    name), so each row's line and check are made from the table's row, not from a subquery's
    copy of it (6-8% less CPU at 1M rows): a key of ``("rowid",)`` is one scan of a rowid range a
    chunk, its end found by a walk of the rowids; a longer key ending in ``rowid`` (``("t",
    "rowid")``) takes the chunk's rowids in key order from the subquery and each row by its rowid
    (CROSS JOIN: SQLite keeps the subquery the outer loop, so its order)."""
    rows = rows or CHUNK
    keys = ", ".join(key)
    after = f" AND ({keys}) > ({', '.join(f':k{i}' for i in range(len(key)))})"
    inner = ", ".join(dict.fromkeys((*key, *columns)))
    # one key column: the chunk's own maximum is its last key; else an index walk finds it
    last_key = f", max({key[0]})" if len(key) == 1 else ""
    conn = reader.conn
    bound: dict[str, Any] = {**params, "sep": sep, "n": rows}
    done: tuple[Any, ...] | None = None
    lines = [(line, check), *fallback]
    previous, conn.text_factory = conn.text_factory, bytes  # the chunk as SQLite made it
    try:
        while True:
            cond = where + ("" if done is None else after)
            line, check = lines[0]
            try:
                # group_concat joins in the order its subquery (or the rowid range) delivers, the key's
                if own_rowid and key == ("rowid",):
                    sql = (f"SELECT group_concat({line}, :sep), count(*), {check}, max(rowid) FROM {source}"
                           f" WHERE {cond} AND rowid <= coalesce((SELECT rowid FROM {source} WHERE {cond}"
                           f" ORDER BY rowid LIMIT 1 OFFSET :n - 1), 9223372036854775807)")
                elif own_rowid and key[-1] == "rowid":
                    sql = (f"SELECT group_concat({line}, :sep), count(*), {check} FROM (SELECT rowid AS _r"
                           f" FROM {source} WHERE {cond} ORDER BY {keys} LIMIT :n) AS _k CROSS JOIN {source}"
                           f" AS _t ON _t.rowid = _k._r")
                else:
                    sql = (f"SELECT group_concat(line, :sep), count(*), {check}{last_key} FROM (SELECT {line}"
                           f" AS line, {inner} FROM {source} WHERE {cond} ORDER BY {keys} LIMIT :n)")
                text, n, good, *last = conn.execute(sql, bound).fetchone()
                if done is None:  # every column the chunks read, checked once (column_guard.py)
                    reader.guard.check()
                if n and n == rows and not last:
                    last = conn.execute(f"SELECT {keys} FROM {source} WHERE {cond} ORDER BY {keys}"
                                        f" LIMIT 1 OFFSET :n - 1", bound).fetchone()
            except sqlite3.DatabaseError:  # an integer overflow in a check, a damaged page
                n, good = 1, False
            if not n:
                return
            if not good:
                if len(lines) > 1:
                    lines.pop(0)
                    continue
                raise Unchecked(done)
            yield text, n
            if n < rows or not last:  # the last chunk (a changed file can lose rows meanwhile)
                return
            done = tuple(last)
            bound.update({f"k{i}": v for i, v in enumerate(done)})
    finally:
        conn.text_factory = previous


def write_chunk(out: TextIO, text: str | bytes) -> None:
    """Write a chunk to ``out``: ASCII bytes straight into the binary file under a UTF-8 text
    file (no decode and encode of megabytes), anything else as text."""
    if isinstance(text, bytes):
        raw = getattr(out, "buffer", None)
        if raw is not None and text.isascii() and str(out.encoding).lower() in ("utf-8", "utf8"):
            out.flush()  # what was written as text goes first
            raw.write(text)
            return
        text = lenient_text(text)
    out.write(text)


def after_key(key: tuple[str, ...], after: tuple[Any, ...] | None) -> tuple[str, tuple[Any, ...]]:
    """An SQL condition (`` AND (t, rowid) > (?, ?)``) and its values: the rows after ``after``
    in ``key`` order (every row when ``after`` is None)."""
    if after is None:
        return "", ()
    return f" AND ({', '.join(key)}) > ({', '.join('?' * len(key))})", after


def csv_text(column: str) -> str:
    """SQL: a TEXT value as a CSV cell (RFC 4180 quoting where needed), a formula guarded by a
    leading ``'``. ``column`` is a quoted column name or an expression (evaluated a few times)."""
    starts = ", ".join(f"char({ord(c)})" for c in FORMULA_START)
    guarded = f"CASE WHEN substr({column}, 1, 1) IN ({starts}) THEN char(39) || {column} ELSE {column} END"
    # GLOB stops at a NUL character, instr() does not: a cell holding one is quoted as well
    return (f"CASE WHEN {column} GLOB {sql_literal(CSV_SPECIAL)} OR instr({column}, char(0))"
            f" THEN '\"' || replace({guarded}, '\"', '\"\"') || '\"' ELSE {guarded} END")


def csv_cell(column: str, text_column: bool = True) -> str:
    """SQL: any value as a CSV cell: NULL empty, an integer its digits, a REAL 18 significant
    digits, text as :func:`csv_text`, a blob in hex. ``text_column``: the schema declares the
    column TEXT (its text is whole, NUL characters included, so the cell must be joined with
    ``||``); else a text value in it (damage) that holds a NUL is written as a blob is (its bytes
    in hex), so the cell can go through printf's ``%s``, which ends a string at a NUL."""
    text = csv_text(column)
    if not text_column:
        text = f"CASE WHEN instr({column}, char(0)) THEN lower(hex({column})) ELSE {text} END"
    arms = [f"WHEN 'text' THEN {text}", f"WHEN 'integer' THEN {column}"]
    if not text_column:  # the likelier type first
        arms.reverse()
    return (f"CASE typeof({column}) {' '.join(arms)} WHEN 'real' THEN {REAL_TEXT.format(column)}"
            f" WHEN 'blob' THEN lower(hex({column})) ELSE '' END")


def csv_line(columns: list[tuple[str, bool]]) -> str:
    """SQL: one CSV line (with its newline) of ``columns`` (quoted name, declared TEXT or not),
    any value in any column as :func:`csv_cell` writes it."""
    if len(columns) == 1:  # an empty line would read as no row at all
        one = csv_cell(*columns[0])
        return f"CASE WHEN {one} = '' THEN '\"\"' ELSE {one} END || char(10)"
    return printf_line([(None, csv_cell(c)) if text else ("%s", csv_cell(c, text_column=False))
                        for c, text in columns])


def printf_line(cells: list[tuple[str | None, str]]) -> str:
    """SQL: one CSV line (with its newline) of two cells or more, each (conversion, expression):
    runs of cells with a printf conversion (``%s``, ``%!.18g``) go through one printf (cheaper
    than ``||`` per cell); a cell without one (text, which may hold a NUL character: printf's
    ``%s`` would end it there) is joined with ``||``. A cell with the conversion ``""`` is
    always empty (no expression)."""
    parts: list[str] = []
    fmt, args = "", []  # the open printf run (its format may hold only commas)
    for i, (conversion, expr) in enumerate(cells):
        comma = "," if i else ""
        if conversion is not None:
            fmt += comma + conversion
            if conversion:
                args.append(expr)
            continue
        if args:
            parts.append(f"printf('{fmt}{comma}', {', '.join(args)})")
        elif fmt or comma:
            parts.append(f"'{fmt}{comma}'")
        fmt, args = "", []
        parts.append(expr)
    parts.append(f"printf('{fmt}' || char(10), {', '.join(args)})" if args else
                 f"'{fmt}' || char(10)" if fmt else "char(10)")
    return " || ".join(parts)


def sql_literal(text: str) -> str:
    """``text`` as an SQL string literal, control characters spelled with char()."""
    parts = []
    for c in text:
        parts.append(f"char({ord(c)})" if ord(c) < 32 else "'" + c.replace("'", "''") + "'")
    return "(" + " || ".join(parts) + ")"


@functools.lru_cache(maxsize=None)
def _probe_values() -> tuple[float, ...]:
    """Doubles of every magnitude (random bit patterns) and the usual suspects."""
    rnd = random.Random(2026)
    out = [0.1, 1 / 3, 2 / 3, 1e23, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
           1763759853.412, 0.000123456789, 9007199254740993.0, -1.5, 123456789.125]
    while len(out) < 4000:
        v = struct.unpack("<d", struct.pack("<Q", rnd.getrandbits(64)))[0]
        if v == v and abs(v) != float("inf"):
            out.append(v)
    return tuple(out)


_checked: dict[str, bool] = {}


def floats_round_trip(conn: sqlite3.Connection) -> bool:
    """Whether this SQLite's :data:`REAL_TEXT` parses back (``float()``) to the same double, on
    4,000 doubles of every magnitude: a build without an extended long double (SQLite before
    3.43 on some platforms) may not, and the export then formats REALs in Python."""
    if sqlite3.sqlite_version not in _checked:
        values = _probe_values()
        ok = True
        for i in range(0, len(values), 500):
            part = values[i:i + 500]
            texts = conn.execute("SELECT " + ", ".join(REAL_TEXT.format("?") for _ in part), part).fetchone()
            ok = ok and all(_parses_to(t, v) for t, v in zip(texts, part))
        _checked[sqlite3.sqlite_version] = ok
    return _checked[sqlite3.sqlite_version]


def _parses_to(text: Any, value: float) -> bool:
    try:
        return float(text) == value
    except (TypeError, ValueError):
        return False
