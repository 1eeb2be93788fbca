"""The readers' SQL aggregates against a plain Python pass over every row of real run files.

A real run (``memscope attach`` on examples/leaky.py) and a long copy of it: its steps and
samples repeated in SQL with shifted step numbers and times (as benchmarks/readers_1m.py builds a
million-step file), where every copy repeats the same peaks (ties: the earliest step must win)
and, in a second copy, the level at each step boundary rises steadily.
"""

from __future__ import annotations

import shutil
import sqlite3
import statistics
from pathlib import Path
from typing import Any

import pytest

from memscope.analysis.summary import summarize
from memscope.analysis.timeline import memory_timeline, step_marks
from memscope.analysis.unexplained import level_series, steady_growth, steady_growth_of
from memscope.report.html import render_html
from memscope.report.html_charts import MAX_STEP_BANDS
from memscope.store.reader import RunReader
from memscope.store.schema import RunFileError
from memscope.store.step_stats import median_step_s, peak_step, step_at, step_stats
from shared_runs import shared_attach

REAL_STEPS = 40
COPIES = 60  # 2,400 steps


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``memscope attach --headless examples/leaky.py --steps 40``, made once per session and read
    only (tests/shared_runs.py; docs/leaks.md's leaky samples are this run): the long files and
    the damaged ones are copies."""
    db, out = shared_attach(tmp_path_factory, [], ["examples/leaky.py", "--steps", str(REAL_STEPS)])
    assert out.returncode == 0, out.stderr
    return db


def _copy(real: Path, dest: Path, ramp: int = 0) -> Path:
    """``real`` with its steps and samples repeated COPIES times, later copies shifted in step
    and time; ``ramp`` bytes a step added to each step's boundary level (steady growth)."""
    shutil.copy(real, dest)
    with sqlite3.connect(dest) as conn:
        n, t0, t1 = conn.execute("SELECT count(*), min(start), max(end) FROM steps").fetchone()
        span = t1 - t0
        cols = [r[1] for r in conn.execute("PRAGMA table_info(steps)")]
        shift = {"step": f"step + k * {n}", "start": f"start + k * {span!r}", "end": f"end + k * {span!r}"}
        conn.execute("CREATE TEMP TABLE k (k INTEGER PRIMARY KEY)")
        conn.executemany("INSERT INTO k VALUES (?)", [(i,) for i in range(1, COPIES)])
        conn.execute(f"INSERT INTO steps ({', '.join(cols)}) SELECT {', '.join(shift.get(c, c) for c in cols)}"
                     " FROM steps, temp.k")
        conn.execute(f"INSERT INTO samples (proc, t, step, phase, rss) SELECT proc, t + k * {span!r},"
                     f" step + k * {n}, phase, rss FROM samples, temp.k WHERE t >= ? AND t < ?", (t0, t1))
        if ramp:
            conn.execute("UPDATE steps SET end_rss = end_rss + step * ?", (ramp,))
    return dest


@pytest.fixture(scope="module")
def long(real: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _copy(real, tmp_path_factory.mktemp("agg") / "long.db")


def _plain(reader: RunReader, proc: int) -> dict[str, Any]:
    """What the reports used to compute from every step row, in Python."""
    steps = reader.steps(proc)
    ok = [s for s in steps if s["status"] == "ok"]
    out: dict[str, Any] = {"rows": len(steps), "ok": len(ok),
                           "last_ok": max((s["step"] for s in ok), default=None),
                           "median": statistics.median([s["end"] - s["start"] for s in ok]) if ok else None}
    for column in ("peak_rss", "peak_allocated"):
        for with_failed in (False, True):
            best = None
            for s in steps:  # strict: the earliest step wins a tie
                good = s["status"] in (("ok", "failed") if with_failed else ("ok",))
                if good and s[column] is not None and (best is None or s[column] > best[0]):
                    best = (s[column], s["step"])
            out[(column, with_failed)] = best
    return out


@pytest.mark.parametrize("which", ["real", "long"])
def test_step_stats_equal_a_pass_over_every_row(which: str, request: pytest.FixtureRequest) -> None:
    db = request.getfixturevalue(which)
    with RunReader(db) as reader:
        stats = step_stats(reader)
        assert sorted(stats) == sorted({s["proc"] for s in reader.steps()})
        for proc, st in stats.items():
            plain = _plain(reader, proc)
            assert (st.rows, st.ok, st.last_ok) == (plain["rows"], plain["ok"], plain["last_ok"])
            assert median_step_s(reader, proc, st.ok) == plain["median"]  # exact, not approx
            for column in ("peak_rss", "peak_allocated"):
                for with_failed in (False, True):
                    best = plain[(column, with_failed)]
                    value = st.peak(column, with_failed)
                    assert value == (best[0] if best else None)
                    if best:
                        assert peak_step(reader, proc, column, value, with_failed) == best[1]
    if which == "long":
        assert plain["rows"] == REAL_STEPS * COPIES
        assert plain[("peak_rss", True)] is not None  # tied in every copy: the first copy's step
        assert plain[("peak_rss", True)][1] < REAL_STEPS


def test_median_of_an_even_and_an_odd_count(long: Path, tmp_path: Path) -> None:
    odd = tmp_path / "odd.db"
    shutil.copy(long, odd)
    with sqlite3.connect(odd) as conn:
        conn.execute("DELETE FROM steps WHERE step = (SELECT max(step) FROM steps)")
    for db in (long, odd):
        with RunReader(db) as reader:
            ok = [s["end"] - s["start"] for s in reader.steps(1) if s["status"] == "ok"]
            assert median_step_s(reader, 1, len(ok)) == statistics.median(ok)
    with RunReader(odd) as reader:
        assert len(reader.steps(1)) % 2 == 1


def test_summary_peak_and_counts_match_the_rows(long: Path) -> None:
    with RunReader(long) as reader:
        s = summarize(reader)
        plain = _plain(reader, 1)
        samples = reader.query("SELECT t, rss FROM samples WHERE proc = 1")
        steps = reader.steps(1)
    assert s.steps == plain["ok"] == REAL_STEPS * COPIES
    assert s.median_step_s == plain["median"]
    assert (s.peak.bytes, s.peak.step) == plain[("peak_rss", True)]
    assert s.peak.whole_run_bytes == max(max(r["rss"] for r in samples), s.peak.bytes)
    assert s.ranks[0].steps == plain["ok"] and s.ranks[0].median_step_s == plain["median"]
    assert (s.ranks[0].peak_bytes, s.ranks[0].peak_step) == plain[("peak_rss", False)]
    top = max(samples, key=lambda r: r["rss"])
    with RunReader(long) as reader:
        assert step_at(reader, 1, top["t"]) == next(
            (st["step"] for st in steps if st["start"] <= top["t"] <= st["end"]), None)


def test_timeline_keeps_the_global_peak_and_every_sample(long: Path) -> None:
    with RunReader(long) as reader:
        tl = memory_timeline(reader, buckets=37)
        rows = reader.query("SELECT rss FROM samples WHERE proc = 1")
    assert tl.primary is not None and tl.primary.max == max(r["rss"] for r in rows)
    assert tl.samples == len(rows) and len(tl.primary.points) <= 37


def _cells(ends: list[float], t0: float, t1: float, width: int) -> set[int]:
    """The ruler's ticks (memscope_tui.widgets.StepRuler): a cell for each step end."""
    return {min(int((e - t0) / (t1 - t0) * width), width - 1) for e in ends if t0 <= e <= t1}


def test_step_marks_draw_the_ticks_of_every_step(long: Path) -> None:
    with RunReader(long) as reader:
        every = reader.steps(1)
        assert step_marks(reader, 1, limit=len(every)) == [
            {k: s[k] for k in ("step", "start", "end", "status")} for s in every]
        limit = 60
        marks = step_marks(reader, 1, limit=limit)
    assert len(marks) <= limit + 2 < len(every)
    ends = [s["end"] for s in every]
    t0, t1 = ends[0] - 1.0, ends[-1]
    for width in (1, 7, 24, 29, limit // 2):
        assert _cells([m["end"] for m in marks], t0, t1, width) == _cells(ends, t0, t1, width), width
    assert [m["step"] for m in marks] == sorted(m["step"] for m in marks)


@pytest.mark.parametrize("gaps", [False, True])
@pytest.mark.parametrize("ramp", [0, 200_000])
def test_steady_growth_in_sql_equals_the_python_envelope(real: Path, tmp_path: Path, ramp: int,
                                                         gaps: bool) -> None:
    db = _copy(real, tmp_path / "ramp.db", ramp)
    if gaps:  # steps that are not consecutive (failed or missing): the window's path
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE steps SET status = 'failed' WHERE step % 97 = 5")
            conn.execute("DELETE FROM steps WHERE step % 89 = 7")
    with RunReader(db) as reader:
        metric, levels = level_series(reader, 1)
        assert steady_growth_of(reader, 1) == (metric, steady_growth(levels))
        if ramp:
            found = steady_growth(levels)
            assert found is not None and found[0] >= ramp  # the ramp is seen: the check is not vacuous


def test_html_draws_step_bands_up_to_the_limit(real: Path, long: Path) -> None:
    with RunReader(real) as reader:
        short = render_html(reader)
    with RunReader(long) as reader:
        assert len(reader.steps(1)) > MAX_STEP_BANDS
        many = render_html(reader)
    assert short.count('class="step"') == (REAL_STEPS + 1) // 2
    assert 'class="step"' not in many


@pytest.mark.parametrize("column, value, words", [
    ("start", "abc", "steps.start holds text 'abc', not a number"),
    ("peak_rss", "big", "steps.peak_rss holds text 'big', not an integer"),
    ("end_rss", b"\x00\x01", "steps.end_rss holds a blob of 2 bytes, not an integer"),
])
def test_a_damaged_step_row_is_one_line(long: Path, tmp_path: Path, column: str, value: object,
                                        words: str) -> None:
    db = tmp_path / "damaged.db"
    shutil.copy(long, db)
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE steps SET {column} = ? WHERE step = 700", (value,))
    with RunReader(db) as reader, pytest.raises(RunFileError, match=words.replace("(", r"\(")):
        summarize(reader)
