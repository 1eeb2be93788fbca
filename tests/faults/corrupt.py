"""Seeded damage to real run files, for the corruption fuzzer (tests/faults/test_corruption.py).

Each variant is a copy of a real run file damaged one way, with a name that says how, so a
failure can be reproduced from its seed alone: flipped bytes (in the header, in a table's pages,
anywhere), truncation, odd values written into columns (NULL where the schema says NOT NULL,
empty strings, blobs, huge and negative numbers, infinities, broken JSON), dropped tables and
columns, a version that lies, removed rows, and files that are not run files at all.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAGE = 4096
# Values written into columns: what a damaged or foreign file may hold.
ODD_VALUES: list[Any] = [None, "", b"\x00\xff\xfe", 2 ** 62, -(2 ** 62), 2 ** 63 - 1, -1, 0,
                         1e308, -1e308, float("inf"), "abc", "\udcff".encode("utf-8", "surrogatepass"),
                         "[", "{\"a\": ", "[" * 5000, "null", "{}", "[1, 2]", "\"text\"", 3.5,
                         "9" * 40, "\xff\xfe"]


@dataclass
class Variant:
    name: str
    path: Path
    damaged_bytes: bool  # the test broke the file itself (integrity_check may fail)


def _copy(base: Path, out: Path) -> Path:
    shutil.copyfile(base, out)
    return out


def _flip(rng: random.Random, path: Path, lo: int, hi: int, n: int) -> str:
    data = bytearray(path.read_bytes())
    hi = min(hi, len(data))
    spots = sorted(rng.randrange(lo, hi) for _ in range(n))
    for i in spots:
        data[i] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return ",".join(map(str, spots[:4]))


def _tables(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]


def _table_pages(path: Path, table: str) -> list[int]:
    """Page numbers holding ``table``'s rows (dbstat may be missing: fall back to its root)."""
    with sqlite3.connect(path) as conn:
        try:
            return [r[0] for r in conn.execute("SELECT pageno FROM dbstat WHERE name = ?", (table,))]
        except sqlite3.Error:
            root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
            return [root[0]] if root else []


def _drop_not_null(conn: sqlite3.Connection) -> None:
    """Rewrite the schema without NOT NULL (as a foreign writer might have made it)."""
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET sql = replace(sql, 'NOT NULL', '') WHERE type = 'table'")
    conn.execute("PRAGMA writable_schema = OFF")
    conn.commit()


def _set_value(rng: random.Random, path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        tables = [t for t in _tables(path) if conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]]
        table = rng.choice(tables)
        cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]
        info = {r[1]: bool(r[3]) for r in conn.execute(f'PRAGMA table_info("{table}")')}
        col = rng.choice(cols)
        value = rng.choice(ODD_VALUES)
        if value is None and info[col]:
            # NULL where the schema forbids it: only a foreign writer's schema allows that
            _drop_not_null(conn)
            conn.close()
            conn = sqlite3.connect(path)
        everywhere = rng.random() < 0.3
        where = "" if everywhere else f' WHERE rowid IN (SELECT rowid FROM "{table}" ORDER BY random() LIMIT 1)'
        try:
            conn.execute(f'UPDATE OR IGNORE "{table}" SET "{col}" = ?{where}', (value,))
            conn.commit()
        except sqlite3.Error as exc:
            return f"{table}.{col}=<{exc}>"
        shown = repr(value)[:24]
        return f"{table}.{col}={shown}{' (all rows)' if everywhere else ''}"
    finally:
        conn.close()


def _schema_damage(rng: random.Random, path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        kind = rng.choice(["drop_table", "drop_column", "rename_table", "version", "app_id",
                           "delete_rows", "delete_run", "empty_table"])
        tables = _tables(path)
        table = rng.choice(tables)
        if kind == "drop_table":
            conn.execute(f'DROP TABLE "{table}"')
            what = table
        elif kind == "drop_column":
            cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")') if not r[5]]
            if not cols:
                return _schema_damage(rng, path)
            col = rng.choice(cols)
            try:
                conn.execute(f'ALTER TABLE "{table}" DROP COLUMN "{col}"')
            except sqlite3.Error:  # indexed columns cannot be dropped: drop the index first
                for (idx,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?",
                                           (table,)).fetchall():
                    conn.execute(f'DROP INDEX "{idx}"')
                conn.execute(f'ALTER TABLE "{table}" DROP COLUMN "{col}"')
            what = f"{table}.{col}"
        elif kind == "rename_table":
            conn.execute(f'ALTER TABLE "{table}" RENAME TO "{table}_old"')
            what = table
        elif kind == "version":
            v = rng.choice([0, 1, 2, 3, 4, 5, 6, 99, -1, 2 ** 31 - 1])
            conn.execute(f"PRAGMA user_version = {v}")
            what = str(v)
        elif kind == "app_id":
            conn.execute(f"PRAGMA application_id = {rng.choice([0, 1, 0x12345678])}")
            what = ""
        elif kind == "delete_rows":
            conn.execute(f'DELETE FROM "{table}" WHERE rowid % 2 = 0')
            what = table
        elif kind == "delete_run":
            conn.execute("DELETE FROM run")
            what = "run"
        else:
            conn.execute(f'DELETE FROM "{table}"')
            what = table
        conn.commit()
        return f"{kind}:{what}"
    finally:
        conn.close()


def make_variant(base: Path, out_dir: Path, seed: int) -> Variant:
    """The ``seed``-th damaged copy of ``base`` (the same seed always gives the same damage)."""
    rng = random.Random(seed)
    out = out_dir / f"v{seed}.db"
    kind = rng.choices(["flip_any", "flip_header", "flip_table", "truncate", "value", "value2",
                        "schema", "foreign"], weights=[3, 1, 4, 2, 6, 2, 3, 1])[0]
    if kind == "foreign":
        which = rng.choice(["empty", "text", "random", "other_sqlite", "zero_page"])
        if which == "empty":
            out.write_bytes(b"")
        elif which == "text":
            out.write_text("not a database\n" * rng.randrange(1, 400))
        elif which == "random":
            out.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3 * PAGE))))
        elif which == "other_sqlite":
            with sqlite3.connect(out) as conn:
                conn.execute("CREATE TABLE run (id INTEGER, status TEXT)")
                conn.execute("INSERT INTO run VALUES (1, 'finished')")
        else:
            out.write_bytes(b"\x00" * PAGE * 4)
        return Variant(f"{seed}:foreign:{which}", out, True)
    _copy(base, out)
    size = out.stat().st_size
    if kind == "flip_any":
        where = _flip(rng, out, 0, size, rng.choice([1, 4, 32, 256]))
        return Variant(f"{seed}:flip:{where}", out, True)
    if kind == "flip_header":
        where = _flip(rng, out, 0, 100, rng.choice([1, 2]))
        return Variant(f"{seed}:flip_header:{where}", out, True)
    if kind == "flip_table":
        table = rng.choice(_tables(out))
        pages = _table_pages(out, table) or [1]
        page = rng.choice(pages)
        lo = (page - 1) * PAGE
        where = _flip(rng, out, lo, lo + PAGE, rng.choice([1, 3, 16, 64]))
        return Variant(f"{seed}:flip_table:{table}:{where}", out, True)
    if kind == "truncate":
        cut = rng.choice([rng.randrange(0, 100), rng.randrange(100, size),
                          rng.randrange(1, max(2, size // PAGE)) * PAGE])
        with open(out, "r+b") as f:
            f.truncate(cut)
        return Variant(f"{seed}:truncate:{cut}", out, True)
    if kind in ("value", "value2"):
        what = _set_value(rng, out)
        if kind == "value2":
            what += ";" + _set_value(rng, out)
        return Variant(f"{seed}:value:{what}", out, False)
    what = _schema_damage(rng, out)
    return Variant(f"{seed}:schema:{what}", out, False)


def integrity_ok(path: Path) -> bool | None:
    """PRAGMA integrity_check on a file (None when it cannot even be opened as a database)."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        finally:
            conn.close()
    except sqlite3.Error:
        return None


