"""The timeline model (memscope.analysis.run_timeline, .categories) against the fixed real run
files of the dashboard tests: categories from the inventories, the leak's group split out of its
category with the verdict's rate, ``other`` against the metric, downsampling in SQL, and the
marks (the peak step, OOMs, attach and detach events)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from memscope.analysis.categories import category_timeline, leak_growth
from memscope.analysis.run_timeline import run_timeline
from memscope.analysis.summary import summarize
from memscope.store.reader import RunReader

DATA = Path(__file__).parent / "tui" / "data"


def _rows(db: Path, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, params).fetchall()


def test_categories_are_the_inventories_with_the_leak_split_out() -> None:
    db = DATA / "leaky.sqlite"
    with RunReader(db) as reader:
        s = summarize(reader)
        tl = run_timeline(reader, s)
    cats = tl.categories
    assert cats.metric == "rss" and cats.at == "end"
    assert cats.stack == ["parameters", "gradients", "optimizer_state", "activations", "leak:0"]  # no other on CPU
    steps = [r[0] for r in _rows(db, "SELECT step FROM inventories ORDER BY step")]
    assert [p.step for p in cats.points] == steps
    lk = s.leaks[0]
    for p in cats.points:
        by_cat = dict(_rows(db, "SELECT category, sum(bytes + graph_bytes) FROM inventory_groups WHERE step = ?"
                            " GROUP BY category", (p.step,)))
        # every byte of the inventory is in one part: its category's, or the leak's
        assert p.tensors == sum(by_cat.values()), p
        assert p.parts["parameters"] == by_cat["parameters"]
        assert p.parts["activations"] + p.parts["leak:0"] == by_cat["activations"]
        (end,), = _rows(db, "SELECT end FROM steps WHERE step = ?", (p.step,))
        (rss,), = _rows(db, "SELECT rss FROM samples WHERE t <= ? ORDER BY t DESC LIMIT 1", (end,))
        assert p.metric == rss and p.parts["other"] == rss - p.tensors
    # the leak's points are its group's, and the fitted line is the verdict's rate
    (g,) = tl.leaks
    assert [v for _, v in g.points] == [p.parts["leak:0"] for p in cats.points]
    assert g.points[-1][1] > g.points[0][1] * 5
    (s0, v0), (s1, v1) = g.fit  # type: ignore[misc]
    assert (s0, s1) == (lk.first_step, lk.last_step)
    assert v1 - v0 == pytest.approx(lk.bytes_per_step * (s1 - s0))
    assert v0 == dict(g.points)[lk.first_step]
    assert [m.kind for m in tl.marks] == ["peak"] and tl.marks[0].step == s.peak.step


def test_profiled_steps_when_no_inventory(tmp_path: Path) -> None:
    db = tmp_path / "noinv.db"
    shutil.copy(DATA / "oom.sqlite", db)
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM inventories")
        conn.execute("DELETE FROM inventory_groups")
    with RunReader(db) as reader:
        cats = category_timeline(reader, 1)
    assert cats.at == "peak" and [p.step for p in cats.points] == [r[0] for r in _rows(
        db, "SELECT step FROM step_breakdown ORDER BY step")]
    (params,), = _rows(db, "SELECT parameters FROM step_breakdown ORDER BY step LIMIT 1")
    assert cats.points[0].parts["parameters"] == params


def test_a_long_run_reads_at_most_limit_inventories_the_heaviest_of_each_span(tmp_path: Path) -> None:
    """1,000 inventories (the leaky run's copied forward): ``limit`` of them, each the one with the
    most bytes in its span of steps; the leak's points on the same steps."""
    db = tmp_path / "long.db"
    shutil.copy(DATA / "leaky.sqlite", db)
    with sqlite3.connect(db) as conn:
        inv = conn.execute("SELECT proc, step, tensors, bytes, graph_bytes, duration_s FROM inventories"
                           " WHERE step = 14").fetchone()
        groups = conn.execute("SELECT * FROM inventory_groups WHERE step = 14").fetchall()
        cols = len(groups[0])
        for step in range(16, 2016, 2):
            heavy = 1 << 20 if step % 100 == 50 else 0  # one spike in each span of 100 steps
            conn.execute("INSERT INTO inventories (proc, step, tensors, bytes, graph_bytes, duration_s)"
                         " VALUES (?, ?, ?, ?, ?, ?)", (inv[0], step, inv[2], inv[3] + heavy, inv[4], inv[5]))
            conn.executemany(f"INSERT INTO inventory_groups VALUES ({', '.join('?' * cols)})",
                             [(g[0], step, *g[2:]) for g in groups])
    with RunReader(DATA / "leaky.sqlite") as reader:
        leaks = summarize(reader).leaks  # flat after step 14 in the copy: the verdict of the original
    with RunReader(db) as reader:
        cats = category_timeline(reader, 1, leaks, limit=20)
        growth = leak_growth(reader, 1, leaks, limit=20)
    assert 15 <= len(cats.points) <= 21
    picked = [p.step for p in cats.points]
    assert sum(1 for st in picked if st % 100 == 50) >= 15  # the heaviest of each span
    assert [st for st, _ in growth[0].points] == picked


def test_marks_draw_attach_detach_and_oom_events(tmp_path: Path) -> None:
    db = tmp_path / "attached.db"
    shutil.copy(DATA / "oom.sqlite", db)
    (started,), = _rows(db, "SELECT started FROM run")
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO events (proc, t, step, kind, message, data) VALUES (1, ?, 1, 'attached', ?, ?)",
                     (started + 1.0, "memscope attached to pid 123", json.dumps({})))
        conn.execute("INSERT INTO events (proc, t, step, kind, message, data) VALUES (1, ?, 2, 'detached', ?, ?)",
                     (started + 2.0, "detached", None))
    with RunReader(db) as reader:
        s = summarize(reader)
        tl = run_timeline(reader, s)
    kinds = [(m.kind, round(m.t, 3)) for m in tl.marks if m.kind in ("attached", "detached")]
    assert kinds == [("attached", 1.0), ("detached", 2.0)]
    assert [m.kind for m in tl.marks].count("oom") == 1 and any(m.kind == "peak" for m in tl.marks)
    assert [m.t for m in tl.marks] == sorted(m.t for m in tl.marks)
