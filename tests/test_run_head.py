"""The dashboard's head read (memscope.analysis.run_head) against the full summary, on real run
files: the same run facts and peak whether read in one SQL pass or row by row, and a re-read
that takes only the rows appended since."""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import memscope.analysis.run_head as run_head
from memscope.analysis.run_head import RunHead
from memscope.analysis.sketch import MaxSketch
from memscope.analysis.summary import summarize
from memscope.analysis.timeline import memory_timeline
from memscope.store.reader import RunReader
from memscope.store.writer import connect_rw

DATA = Path(__file__).parent / "tui" / "data"
RUNS = ["leaky.sqlite", "oom.sqlite", "peft.sqlite"]
HEAD_FIELDS = ("command", "status", "exit_code", "signal", "device", "torch", "steps", "samples",
               "dropped", "started", "ended", "step_mode", "main_proc")


def _same_head(head: Any, full: Any) -> None:
    for name in HEAD_FIELDS:
        assert getattr(head, name) == getattr(full, name), name
    assert (head.peak.bytes, head.peak.step, head.peak.metric, head.peak.proc) == \
           (full.peak.bytes, full.peak.step, full.peak.metric, full.peak.proc)
    assert (head.oom is None) == (full.oom is None)
    if full.oom is not None:
        assert (head.oom.kind, head.oom.step, head.oom.proc) == (full.oom.kind, full.oom.step, full.oom.proc)


@pytest.mark.parametrize("name", RUNS)
@pytest.mark.parametrize("aggregate", [False, True], ids=["rows", "sql"])
def test_head_matches_the_full_summary(name: str, aggregate: bool, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / name
    shutil.copy(DATA / name, db)
    if aggregate:  # a long run's first read: counts and maxima in SQL, samples as chunk maxima
        monkeypatch.setattr(run_head, "DIRECT_ROWS", 0)
    with RunReader(db) as reader:
        head = RunHead().read(reader)
        full = summarize(reader)
        timeline = memory_timeline(reader, 200)
    _same_head(head.summary, full)
    assert head.steps and head.steps[0].step == max(r.step for r in head.steps)
    # the downsampled timeline keeps the run's first and last sample and its highest reading
    primary, exact = head.timeline.primary, timeline.primary
    assert primary is not None and exact is not None
    assert primary.max == exact.max
    assert (head.timeline.t0, head.timeline.t1, head.timeline.samples) == (timeline.t0, timeline.t1, timeline.samples)
    assert len(primary.points) <= run_head.SKETCH_BUCKETS


def _append(db: Path, samples: int, rss: int, step_peak: int) -> tuple[int, int]:
    """A writer's next rows: ``samples`` host samples and one completed step. Returns (the new
    step, rows written)."""
    conn = sqlite3.connect(db, isolation_level=None)
    proc, t, step = conn.execute("SELECT proc, max(t), max(step) FROM samples GROUP BY proc"
                                 " ORDER BY count(*) DESC").fetchone()
    last = conn.execute("SELECT max(step), max(end) FROM steps WHERE proc = ?", (proc,)).fetchone()
    new_step = int(last[0]) + 1
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO samples (proc, t, step, phase, rss) VALUES (?, ?, ?, 'forward', ?)",
                     [(proc, t + (i + 1) * 0.001, new_step, rss + i) for i in range(samples)])
    conn.execute("INSERT INTO steps (proc, step, start, end, peak_rss, status) VALUES (?, ?, ?, ?, ?, 'ok')",
                 (proc, new_step, last[1], t + samples * 0.001, step_peak))
    conn.execute("COMMIT")
    conn.close()
    return new_step, samples + 1


@pytest.mark.parametrize("aggregate", [False, True], ids=["rows", "sql"])
def test_a_second_read_takes_only_the_new_rows(aggregate: bool, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "run.db"
    shutil.copy(DATA / "leaky.sqlite", db)
    if aggregate:
        monkeypatch.setattr(run_head, "DIRECT_ROWS", 0)
    head = RunHead()
    with RunReader(db) as reader:
        first = head.read(reader)
        assert head.read(reader).rows_read == 0  # nothing new: nothing read
    monkeypatch.setattr(run_head, "DIRECT_ROWS", 20_000)  # what was appended is read row by row
    old_peak = first.summary.peak.bytes
    assert old_peak is not None and first.timeline.primary is not None
    high = first.timeline.primary.max
    assert high is not None
    step, written = _append(db, 37, high + 1000, old_peak + 5000)  # new, higher peaks
    with RunReader(db) as reader:
        later = head.read(reader)
        full = summarize(reader)
        timeline = memory_timeline(reader, 200)
    assert later.rows_read == written
    _same_head(later.summary, full)
    assert later.summary.peak.step == step and later.summary.steps == first.summary.steps + 1
    assert later.steps[0].step == step
    assert later.timeline.primary is not None and timeline.primary is not None
    assert later.timeline.primary.max == timeline.primary.max == high + 1000 + 36
    assert later.timeline.t1 == timeline.t1 and later.timeline.samples == timeline.samples


def test_folded_steps_start_the_tally_over(tmp_path: Path) -> None:
    """The writer of a long run folds steps into windows, deleting their rows, possibly before a
    reader saw them: the head then counts them from the windows, as the summary does."""
    db = tmp_path / "run.db"
    shutil.copy(DATA / "leaky.sqlite", db)
    connect_rw(str(db)).close()  # brought to today's schema (step_windows came with version 10)
    head = RunHead()
    with RunReader(db) as reader:
        before = head.read(reader).summary.steps
    conn = sqlite3.connect(db, isolation_level=None)
    proc, last, end = conn.execute("SELECT proc, max(step), max(end) FROM steps GROUP BY proc"
                                   " ORDER BY count(*) DESC").fetchone()
    conn.execute("BEGIN")  # three more steps, folded (rows gone) before the head reads again
    conn.execute("INSERT INTO step_windows (proc, first_step, last_step, steps, start, end, duration_min,"
                 " duration_max, duration_sum) VALUES (?, ?, ?, 3, ?, ?, 0.01, 0.01, 0.03)",
                 (proc, last + 1, last + 3, end, end + 0.03))
    conn.execute("COMMIT")
    conn.close()
    with RunReader(db) as reader:
        after = head.read(reader).summary
        full = summarize(reader)
    assert after.steps == full.steps == before + 3


def test_sketch_buckets_hold_each_bucket_maximum() -> None:
    """Against brute force: after any number of doublings each bucket holds the maximum (and
    its earliest time) of the values that fell in it, and the global maximum is exact."""
    rng = random.Random(7)
    sk = MaxSketch(size=16, origin=0.0, width=0.5)
    points = [(i * 0.37, rng.randrange(1000)) for i in range(5000)]
    for t, v in points:
        sk.add("x", t, v)
    assert sk.width > 0.5 and sk.rows == len(points)
    want: dict[int, tuple[float, int]] = {}
    for t, v in points:
        i = int(t / sk.width)
        if i not in want or v > want[i][1]:
            want[i] = (t, v)
    assert sk.points("x") == [want[i] for i in sorted(want)]
    assert len(sk.points("x")) <= 16
    assert sk.max("x") == max(points, key=lambda p: (p[1], -p[0]))


@pytest.mark.parametrize("aggregate", [False, True], ids=["rows", "sql"])
def test_cuda_peak_and_series_match(aggregate: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with allocator samples on two devices (added to a real CPU run's file): the peak is
    the allocator's column, the series are summed over devices, as in the full reads."""
    db = tmp_path / "cuda.db"
    shutil.copy(DATA / "leaky.sqlite", db)
    conn = sqlite3.connect(db, isolation_level=None)
    proc, = conn.execute("SELECT proc FROM samples GROUP BY proc ORDER BY count(*) DESC").fetchone()
    rng = random.Random(3)
    times = [r[0] for r in conn.execute("SELECT t FROM samples WHERE proc = ? ORDER BY t", (proc,))]
    conn.execute("BEGIN")
    for device in (0, 1):
        conn.executemany("INSERT INTO cuda_samples (proc, t, device, allocated, allocated_peak, reserved,"
                         " reserved_peak) VALUES (?, ?, ?, ?, ?, ?, ?)",
                         [(proc, t, device, a, a, a * 2, a * 2) for t, a in
                          ((t, rng.randrange(1 << 20, 1 << 30)) for t in times)])
    steps = [r[0] for r in conn.execute("SELECT step FROM steps WHERE proc = ?", (proc,))]
    conn.executemany("UPDATE steps SET peak_allocated = ? WHERE proc = ? AND step = ?",
                     [(rng.choice([7 << 20, 9 << 20]), proc, s) for s in steps])  # ties: the earliest
    conn.execute("COMMIT")
    conn.close()
    if aggregate:
        monkeypatch.setattr(run_head, "DIRECT_ROWS", 0)
    with RunReader(db) as reader:
        head = RunHead().read(reader)
        full = summarize(reader)
        timeline = memory_timeline(reader, 200)
    _same_head(head.summary, full)
    assert head.summary.peak.metric == "cuda_allocated" and head.summary.peak.bytes == 9 << 20
    assert list(head.timeline.series) == list(timeline.series)  # CUDA first: the primary series
    assert head.timeline.series["rss"].max == timeline.series["rss"].max
    # summed over devices per bucket: at least the highest sum at one instant, at most the sum
    # of each device's highest
    conn = sqlite3.connect(db)
    at_once = conn.execute("SELECT max(s) FROM (SELECT sum(allocated) AS s FROM cuda_samples"
                           " GROUP BY t)").fetchone()[0]
    apart = conn.execute("SELECT sum(m) FROM (SELECT max(allocated) AS m FROM cuda_samples"
                         " GROUP BY device)").fetchone()[0]
    conn.close()
    high = head.timeline.series["cuda_allocated"].max
    assert high is not None and at_once <= high <= apart
