"""memory_timeline / recent_steps against a real run file written by ``memscope attach``."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from memscope.analysis.timeline import main_process, memory_timeline, recent_steps
from memscope.store.reader import RunReader
from memscope.store.runs import create_run
from shared_runs import shared_attach

ROOT = Path(__file__).resolve().parent.parent
STEPS = 8


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dashboard tests' run of examples/tiny_gpt.py (made once per session: tests/shared_runs.py)."""
    db, out = shared_attach(tmp_path_factory, [], ["examples/tiny_gpt.py", "--steps", str(STEPS)])
    assert out.returncode == 0, out.stderr
    # fail here, with the agent's words, if the run recorded nothing to draw
    assert _sql(db, "SELECT count(*) FROM samples")[0][0] > 0, out.stderr
    return db


def _sql(db: Path, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("buckets", [1, 7, 50, 200])
def test_rss_series_is_bucketed_max_of_the_samples(tiny_run: Path, buckets: int) -> None:
    with RunReader(tiny_run) as reader:
        tl = memory_timeline(reader, buckets=buckets)
    (n_samples, max_rss, t_min, t_max), = _sql(
        tiny_run, "SELECT count(*), max(rss), min(t), max(t) FROM samples WHERE proc = ?", (tl.proc,))
    (started,), = _sql(tiny_run, "SELECT started FROM run")
    assert list(tl.series) == ["rss"]  # a CPU run: host RSS only
    rss = tl.series["rss"]
    assert tl.primary is rss and rss.label == "host RSS"
    assert 1 <= len(rss.points) <= buckets
    times = [t for t, _ in rss.points]
    assert times == sorted(times) and len(set(times)) == len(times)  # strictly increasing
    assert all(isinstance(v, int) and v > 0 for _, v in rss.points)
    assert rss.max == max_rss
    assert tl.samples == n_samples  # every sample fell in exactly one bucket
    assert tl.origin == started
    assert tl.t0 == pytest.approx(t_min - started) and tl.t1 == pytest.approx(t_max - started)
    assert all(tl.t0 <= t <= tl.t1 for t in times)
    if buckets == 1:
        assert rss.points == [(pytest.approx(rss.points[0][0]), max_rss)]


def test_each_point_is_a_real_sample_and_its_bucket_max(tiny_run: Path) -> None:
    with RunReader(tiny_run) as reader:
        tl = memory_timeline(reader, buckets=10)
    (started,), = _sql(tiny_run, "SELECT started FROM run")
    (t_min, t_max), = _sql(tiny_run, "SELECT min(t), max(t) FROM samples WHERE proc = ?", (tl.proc,))
    width = (t_max - t_min) / 10
    for t, v in tl.series["rss"].points:
        # the point is dated at a sample holding that value...
        (t_abs,), = _sql(tiny_run, "SELECT t FROM samples WHERE proc = ? AND abs(t - ?) < 1e-6 AND rss = ?",
                         (tl.proc, t + started, v))
        # ...and nothing in its bucket is higher
        b = min(int((t_abs - t_min) / width), 9)
        lo, hi = t_min + b * width, (t_min + (b + 1) * width if b < 9 else t_max + 1)
        (bucket_max,), = _sql(tiny_run, "SELECT max(rss) FROM samples WHERE proc = ? AND t >= ? AND t < ?",
                              (tl.proc, lo, hi))
        assert bucket_max == v


def test_step_boundaries_come_with_the_timeline(tiny_run: Path) -> None:
    with RunReader(tiny_run) as reader:
        tl = memory_timeline(reader)
    assert [m.step for m in tl.steps] == list(range(STEPS))
    assert all(m.start <= m.end for m in tl.steps)
    assert all(a.end <= b.start + 1e-9 for a, b in zip(tl.steps, tl.steps[1:]))
    assert all(m.status == "ok" for m in tl.steps)


def test_recent_steps_newest_first(tiny_run: Path) -> None:
    with RunReader(tiny_run) as reader:
        proc = main_process(reader)
        last3 = recent_steps(reader, limit=3)
        everything = recent_steps(reader, limit=1000)
    assert proc == 1
    assert [r.step for r in last3] == [STEPS - 1, STEPS - 2, STEPS - 3]
    assert [r.step for r in everything] == list(reversed(range(STEPS)))
    rows = _sql(tiny_run, "SELECT step, start, end, peak_rss FROM steps ORDER BY step DESC")
    for r, (step, start, end, peak_rss) in zip(everything, rows):
        assert (r.step, r.start, r.end, r.peak_rss) == (step, start, end, peak_rss)
        assert r.duration_s == pytest.approx(end - start) and r.duration_s >= 0
        assert r.peak_allocated is None  # CPU run


def test_on_grid_fills_gaps_and_keeps_the_max(tiny_run: Path) -> None:
    with RunReader(tiny_run) as reader:
        tl = memory_timeline(reader, buckets=200)
    rss = tl.series["rss"]
    grid = rss.on_grid(500, tl.t0, tl.t1)  # more slots than points: some are empty
    assert len(grid) == 500
    assert max(grid) == rss.max and min(grid) >= (rss.min or 0)
    assert grid[0] == rss.points[0][1] and grid[-1] == rss.points[-1][1]
    assert rss.on_grid(0, tl.t0, tl.t1) == []


def test_bad_bucket_count(tiny_run: Path) -> None:
    with RunReader(tiny_run) as reader, pytest.raises(ValueError):
        memory_timeline(reader, buckets=0)


def test_run_file_with_no_process_yet(tmp_path: Path) -> None:
    # the state a live run is in right after `memscope attach` created the file
    db = tmp_path / "fresh.db"
    create_run(str(db), ["python", "train.py"])
    with RunReader(db) as reader:
        tl = memory_timeline(reader)
        assert recent_steps(reader) == []
    assert tl.proc is None and tl.series == {} and tl.primary is None and tl.steps == []


def test_cuda_series_are_summed_over_devices(tiny_run: Path, tmp_path: Path) -> None:
    # No GPU here: hand-written cuda_samples rows, on a copy of the real run, test only the
    # bucketing and the per-bucket sum over devices (not what a real allocator reports).
    db = tmp_path / "cuda.db"
    shutil.copy(tiny_run, db)
    (t_min, t_max), = _sql(db, "SELECT min(t), max(t) FROM samples WHERE proc = 1")
    rows = []
    for i in range(10):
        t = t_min + (t_max - t_min) * i / 9
        rows.append((1, t, 0, 1000 * (i + 1), 2000 * (i + 1)))
        rows.append((1, t, 1, 10 * (i + 1), 20 * (i + 1)))
    conn = sqlite3.connect(db)
    with conn:
        conn.executemany("INSERT INTO cuda_samples (proc, t, device, allocated, reserved)"
                         " VALUES (?, ?, ?, ?, ?)", rows)
    conn.close()
    with RunReader(db) as reader:
        tl = memory_timeline(reader, buckets=10)
    assert list(tl.series) == ["cuda_allocated", "cuda_reserved", "rss"]
    assert tl.primary is not None and tl.primary.metric == "cuda_allocated"
    assert [v for _, v in tl.series["cuda_allocated"].points] == [1010 * (i + 1) for i in range(10)]
    assert [v for _, v in tl.series["cuda_reserved"].points] == [2020 * (i + 1) for i in range(10)]
