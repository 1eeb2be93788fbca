"""Damaged values are inert (memscope/store/column_rules.py, column_guard.py): a NULL where the
schema requires a value, a value of another type, or a number out of its column's range gives one
line (``damaged run file: TABLE.COLUMN ...``) and exit 2, never a traceback and never a wrong
figure.

The plants are generated from the schema: every table x every column x {NULL (NOT NULL columns),
a wrong type, out of range (numbers; the JSON columns: text that is not their JSON)}, each in a
copy of a real run (examples/oom.py, the session's shared run) whose empty tables got one valid
row. Every plant against the reading side's guard; every reader (report, its JSON and HTML,
leaks, layers, oom, export, diff, merge, the dashboard's reader) against a plant in every table,
in process: a reader exits 2 naming the damaged column, or, when it never reads that table,
prints exactly what it prints for the undamaged file. The dashboard itself (Pilot) on a few.
"""

from __future__ import annotations

import shutil
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from faults.fuzz import commands, run
from memscope.store.column_rules import Rule, rules
from memscope.store.reader import RunReader
from memscope.store.schema import SCHEMA_VERSION, RunFileError, expected_tables

# valid rows for the tables a CPU run leaves empty, so every table has a row to damage
EXTRA_ROWS = {
    "cuda_samples": {"proc": 1, "device": 0, "allocated": 1 << 20, "allocated_peak": 2 << 20,
                     "reserved": 4 << 20, "reserved_peak": 4 << 20, "active": 1 << 20,
                     "active_peak": 2 << 20, "inactive_split": 0, "alloc_retries": 0, "ooms": 0},
    "nvml_samples": {"proc": 1, "device": 0, "used": 8 << 20, "total": 16 << 30},
    "leak_holders": {"proc": 1, "step": 2, "category": "activations", "dtype": "float32",
                     "shape": "[64, 2048]", "device": "cpu", "requires_grad": 0, "grad_fn": None,
                     "held_by": "__main__.CACHE", "site": "oom.py:1", "module": None,
                     "created_at": "oom.py:1"},
    "worker_samples": {"proc": 1, "pid": 99999, "uss": 1 << 20, "pss": 2 << 20, "rss": 3 << 20},
    "step_windows": {"proc": 1, "first_step": 1000, "last_step": 1001, "steps": 2, "duration_min": 0.1,
                     "duration_max": 0.2, "duration_sum": 0.3, "peak_rss": 1 << 20, "peak_rss_step": 1000,
                     "peak_rss_sum": 2 << 20, "peak_allocated": None, "peak_allocated_step": None,
                     "peak_reserved": None, "end_rss": 1 << 20, "end_rss_step": 1001,
                     "end_allocated": None, "end_allocated_step": None},
}
ROW_IDS = {("processes", "id"), ("migrations", "version")}
TIMED = {"cuda_samples": ("t",), "nvml_samples": ("t",), "worker_samples": ("t",),
         "step_windows": ("start", "end")}


def plants(rule: Rule) -> list[tuple[str, Any]]:
    """The schema's own word on type and NOT NULL (the product's rule only for the range)."""
    declared, notnull = expected_tables(SCHEMA_VERSION)[rule.table][rule.column]
    return _plants(replace(rule, kind=declared, required=notnull))


def _plants(rule: Rule) -> list[tuple[str, Any]]:
    """(kind, value) planted into ``rule``'s column: each way a value can be damaged. A row id
    (``INTEGER PRIMARY KEY``) holds only integers, and ``run.id`` only 1 (a CHECK): SQLite
    itself refuses the rest."""
    out: list[tuple[str, Any]] = []
    if (rule.table, rule.column) == ("run", "id"):
        return out
    if (rule.table, rule.column) in ROW_IDS:
        return [("range", int(rule.high or 0) + 1)]
    if rule.required:
        out.append(("null", None))
    if rule.kind == "TEXT":
        out.append(("type", b"\x00\xff"))  # a blob: a TEXT column keeps it as one
        if rule.json:
            out.append(("range", "[1, " if rule.json == "sizes" else '["a", 1]'))
    else:
        out.append(("type", "x"))  # text: an INTEGER or REAL column keeps it as text
        if rule.kind == "INTEGER":
            out.append(("type", 2.5))
        assert rule.low is not None and rule.high is not None, (rule.table, rule.column)
        beyond = rule.high + 1 if rule.kind == "INTEGER" else rule.high * 2
        out.append(("range", int(beyond) if rule.kind == "INTEGER" else float(beyond)))
        if rule.low >= 0:
            out.append(("range", -1 if rule.kind == "INTEGER" else -1.0))
    return out


MATRIX = [(r, kind, value) for table in rules().values() for r in table.values() for kind, value in plants(r)]


@pytest.fixture(scope="module")
def base(oom_example_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared real run, every table given a row (the valid rows above)."""
    db = tmp_path_factory.mktemp("damage") / "base.db"
    shutil.copyfile(oom_example_run, db)
    with sqlite3.connect(db) as conn:
        started = conn.execute("SELECT started FROM run").fetchone()[0]
        for table, row in EXTRA_ROWS.items():
            if conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]:
                continue
            row = {**row, **{c: started + 1.0 + i for i, c in enumerate(TIMED.get(table, ()))}}
            conn.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                         tuple(row.values()))
        empty = [t for t in rules() if not conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]]
    assert not empty, empty
    with RunReader(db) as reader:
        reader.check_tables()  # the base itself is clean
    return db


def plant(base: Path, out: Path, table: str, column: str, value: Any) -> Path:
    """A copy of ``base`` with ``value`` in ``column`` of the table's last row. A NULL under NOT
    NULL goes in as a file from elsewhere would hold it: the declaration lifted for the update
    and put back (SQLite does not check rows already there)."""
    shutil.copyfile(base, out)
    conn = sqlite3.connect(out)
    try:
        schema = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
        if value is None:
            conn.execute("PRAGMA writable_schema = ON")
            conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?",
                         (schema.replace(" NOT NULL", ""), table))
            conn.commit()
            conn.close()
            conn = sqlite3.connect(out)
        conn.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE rowid = (SELECT max(rowid) FROM "{table}")',
                     (value,))
        conn.commit()
        if value is None:
            conn.execute("PRAGMA writable_schema = ON")
            conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (schema, table))
            conn.commit()
        (typed,) = conn.execute(f'SELECT typeof("{column}") FROM "{table}" WHERE rowid = '
                                f'(SELECT max(rowid) FROM "{table}")').fetchone()
    finally:
        conn.close()
    assert typed == {type(None): "null", str: "text", bytes: "blob", float: "real", int: "integer"}[type(value)]
    return out


@pytest.mark.parametrize("rule, kind, value", MATRIX,
                         ids=[f"{r.table}.{r.column}-{k}-{v!r}"[:60] for r, k, v in MATRIX])
def test_every_column_every_damage(base: Path, tmp_path: Path, rule: Rule, kind: str, value: Any) -> None:
    db = plant(base, tmp_path / "d.db", rule.table, rule.column, value)
    with RunReader(db) as reader:
        with pytest.raises(RunFileError) as raised:
            reader.check_tables([rule.table])
    line = str(raised.value)
    assert "\n" not in line and line.startswith(f"{db}: damaged run file: {rule.table}.{rule.column} holds ")
    with RunReader(db) as reader:  # the other tables are not touched by it
        reader.check_tables([t for t in rules() if t != rule.table])


def _readers(db: Path, other: Path, out: Path) -> list[list[str]]:
    return [*commands(db, other, out), ["export", str(db), "--csv", "-"],
            ["merge", str(out / "merged.db"), str(db), "--force", "--allow-unrelated"]]


def _outputs(result: Any, out: Path, db: Path) -> str:
    """What a reader printed and wrote, its paths made the base's."""
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "merged.db")
    text = result.out + result.err + "".join(f"\n{p.relative_to(out)}\n" + p.read_text(errors="replace")
                                             for p in files)
    return text.replace(str(db), "RUN").replace(str(out), "OUT")


def test_every_reader_on_damage_in_every_table(base: Path, tmp_path: Path) -> None:
    """For each reader, a plant in each table (a different column and kind each time, so the
    readers between them cover many): exit 2 and the line naming it, or exactly the output of
    the undamaged file."""
    clean_dir, work = tmp_path / "clean", tmp_path / "work"
    clean_db = tmp_path / "clean.db"
    shutil.copyfile(base, clean_db)
    argvs = _readers(clean_db, base, clean_dir)
    clean: dict[int, str] = {}
    for i, argv in enumerate(argvs):
        shutil.rmtree(clean_dir, ignore_errors=True)
        clean_dir.mkdir()
        res = run(argv)
        assert res.code == 0 and res.problem is None, (argv, res.err)
        clean[i] = _outputs(res, clean_dir, clean_db)
    by_table = {t: [m for m in MATRIX if m[0].table == t] for t in rules()}
    problems, refused, read_as_clean = [], 0, 0
    for j, (table, plants_of) in enumerate(sorted(by_table.items())):
        for i, argv in enumerate(argvs):
            rule, kind, value = plants_of[(i * 7 + j) % len(plants_of)]
            db = plant(base, tmp_path / "d.db", table, rule.column, value)
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            res = run(_readers(db, base, work)[i])
            where = f"{argv[0]} {' '.join(argv[2:3])} on {table}.{rule.column}={value!r}"
            if res.problem is not None:
                problems.append(f"{where}: {res.problem}")
            elif res.code == 2:
                refused += 1
                if f"damaged run file: {table}.{rule.column} holds " not in res.err:
                    problems.append(f"{where}: {res.err.strip()}")
                elif res.out:  # nothing of the file shown before the line (an export to stdout)
                    problems.append(f"{where}: printed {len(res.out)} characters before refusing")
            elif _outputs(res, work, db) != clean[i]:
                problems.append(f"{where}: exit 0 with an output that differs from the clean file's")
            else:
                read_as_clean += 1
    assert not problems, "\n".join(problems[:30])
    assert refused > 0.6 * len(by_table) * len(argvs)  # most readers read most tables
    # merge copies every table: it refuses every plant
    assert refused >= len(by_table)


def test_the_dashboards_reader_names_the_damage(base: Path, tmp_path: Path) -> None:
    """The dashboard's reader (the same snapshot its views draw) on text in a number column of
    each table: the line, or for the tables it never reads (the schema's bookkeeping; the side
    files the supervisor replays at the end of a run, which only the writer reads), a read as of
    the clean file."""
    from memscope_tui.data import load_snapshot

    unread = []
    for table in rules():
        rule = next(r for r in rules()[table].values()
                    if r.kind != "TEXT" and (table, r.column) not in ROW_IDS | {("run", "id")})
        db = plant(base, tmp_path / f"{table}.db", table, rule.column, "x")
        try:
            load_snapshot(str(db))
        except RunFileError as exc:
            assert f"damaged run file: {table}.{rule.column} holds text" in str(exc)
        else:
            unread.append(table)
    assert unread == ["migrations", "side_files"]


@pytest.mark.parametrize("table, column, value", [
    ("steps", "end", None),  # the issue's: a traceback in the dashboard, silence elsewhere
    ("samples", "rss", "abc"),
    ("processes", "pid", None),
    ("layer_stats", "saved_bytes", -5),
    ("run", "status", b"\x01"),
])
async def test_the_dashboard_says_it_on_screen(base: Path, tmp_path: Path, table: str, column: str,
                                              value: Any) -> None:
    from memscope_tui.app import MemscopeApp

    db = plant(base, tmp_path / "d.db", table, column, value)
    app = MemscopeApp(str(db), poll_s=0.1)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        for _ in range(400):
            if app.last_error is not None:
                break
            await pilot.pause(0.02)
        assert app.last_error is not None and app.is_running
        shown = " ".join(str(n.message) for n in app._notifications)
    assert f"damaged run file: {table}.{column} holds" in app.last_error
    assert f"{table}.{column} holds" in shown and "Traceback" not in shown
    assert app.loads == 0  # nothing drawn from the damaged file
