"""``timeline.csv`` of a run recorded on a real GPU (tests/data/cuda_run_leak_real.db, an H100),
its CUDA series copied until they are many blocks long: every GPU row reads back to the stored
value, in order (metric, device, time), and the series are streamed a block at a time, never held
whole (a week of 20 Hz CUDA samples is millions of rows: the export held them all in a list,
425 MB for 1M rows)."""

from __future__ import annotations

import io
import shutil
import sqlite3
import tracemalloc
from pathlib import Path

from memscope.report import csv_export
from memscope.store.reader import RunReader

DATA = Path(__file__).parent / "data"
COPIES = 400  # the file's 87 CUDA samples x 400: 34,800 samples, 69,600 rows of the two metrics


def _many_gpu_rows(tmp_path: Path) -> Path:
    db = Path(shutil.copy(DATA / "cuda_run_leak_real.db", tmp_path / "run.db"))
    with sqlite3.connect(db) as conn:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(cuda_samples)")]
        lo, hi = conn.execute("SELECT min(t), max(t) FROM cuda_samples").fetchone()
        shifted = ", ".join(f"t + k.i * {hi - lo + 0.05!r}" if c == "t" else c for c in cols)
        conn.execute(f"WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < {COPIES - 1})"
                     f" INSERT INTO cuda_samples ({', '.join(cols)}) SELECT {shifted} FROM cuda_samples, k")
    return db


def test_gpu_rows_read_back_in_order_streamed(tmp_path: Path) -> None:
    db = _many_gpu_rows(tmp_path)
    with sqlite3.connect(db) as conn:
        started = conn.execute("SELECT started FROM run").fetchone()[0]
        want = [(m, f"cuda:{d}", t, v) for m, table, col in (("cuda_allocated", "cuda_samples", "allocated"),
                                                             ("cuda_reserved", "cuda_samples", "reserved"),
                                                             ("nvml_used", "nvml_samples", "used"))
                for t, d, v in conn.execute(f"SELECT t, device, {col} FROM {table} WHERE {col} IS NOT NULL"
                                            " ORDER BY device, t")]
    assert len(want) > 8 * csv_export.BATCH
    out = io.StringIO()
    tracemalloc.start()
    try:
        with RunReader(str(db)) as reader:
            rows = csv_export.write_timeline(reader, out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    lines = out.getvalue().splitlines()[1:]
    gpu = [ln.split(",") for ln in lines if ",cuda:" in ln]
    assert rows == len(lines) and len(gpu) == len(want)
    for got, (metric, device, t, value) in zip(gpu, want):
        assert got[4:] == ["", "", metric, device, str(value)], got
        assert abs(float(got[3]) - t) <= 5e-7 and abs(float(got[2]) - (t - started)) <= 5e-7
    # streamed: what the export held at once is a few blocks of lines, not the 69,600 rows as
    # lists (held whole they took about 30 MB here; the text written is about 5 MB)
    assert peak < 12 * 2**20, peak
