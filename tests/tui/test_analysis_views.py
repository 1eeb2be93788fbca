"""memscope.analysis.views: the dashboard's own reads, on real run files and on run files built
row by row (the CUDA tables cannot be filled on a CPU machine, so those rows are written here and
the expected values are worked out from them in the test)."""

from __future__ import annotations

from pathlib import Path

from memscope.analysis.summary import summarize
from memscope.analysis.timeline import memory_timeline
from memscope.analysis.views import (breakdown_for, breakdown_steps, device_used, extra_series,
                                     fragmentation, position)
from memscope.store.reader import RunReader
from memscope.store.runs import create_run, register_process
from memscope.store.writer import connect_rw

GiB = 1 << 30


def cuda_run(path: Path) -> int:
    create_run(str(path), ["python", "train.py"], started=1000.0)
    proc = register_process(str(path), {"pid": 1, "device": "cuda", "started": 1000.0, "status": "stopped"})
    conn = connect_rw(str(path))
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        # two devices sampled together at t = 1001..1004; reserved peaks at t = 1003
        for t, alloc, reserved, split in ((1001, 1, 2, 0), (1002, 3, 4, 1), (1003, 2, 6, 2), (1004, 1, 5, 1)):
            for device in (0, 1):
                conn.execute("INSERT INTO cuda_samples (proc, t, device, allocated, allocated_peak,"
                             " reserved, inactive_split, alloc_retries, ooms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
                             (proc, float(t), device, alloc * GiB, 3 * GiB if t >= 1002 else alloc * GiB,
                              reserved * GiB, split * GiB, t - 1001))
            conn.execute("INSERT INTO samples (proc, t, step, phase, rss) VALUES (?, ?, ?, 'forward', ?)",
                         (proc, float(t), t - 1001, GiB))
        for t, used in ((1001.5, 3), (1003.5, 7)):
            for device in (0, 1):
                conn.execute("INSERT INTO nvml_samples (proc, t, device, used, total) VALUES (?, ?, ?, ?, ?)",
                             (proc, t, device, used * GiB, 80 * GiB))
    conn.close()
    return proc


def test_fragmentation_at_the_most_reserved(tmp_path: Path) -> None:
    db = tmp_path / "cuda.db"
    proc = cuda_run(db)
    with RunReader(db) as reader:
        frag = fragmentation(reader, proc)
    assert frag is not None
    assert frag.t == 3.0  # seconds since the run started
    assert (frag.reserved, frag.allocated) == (12 * GiB, 4 * GiB)  # both devices summed
    assert frag.unused == 8 * GiB and abs(frag.ratio - 8 / 12) < 1e-9
    assert frag.inactive_split == 4 * GiB and frag.alloc_retries == 2


def test_device_used_follows_the_timeline_buckets(tmp_path: Path) -> None:
    db = tmp_path / "cuda.db"
    proc = cuda_run(db)
    with RunReader(db) as reader:
        tl = memory_timeline(reader, 3)
        used = device_used(reader, tl, 3)
    assert tl.proc == proc and used is not None
    assert [v for _, v in used.points] == [6 * GiB, 14 * GiB]  # summed over the two devices
    assert [t for t, _ in used.points] == [1.5, 3.5]
    with RunReader(db) as reader:
        extra = {s.metric: s for s in extra_series(reader, tl, 3)}
    assert list(extra) == ["cuda_peak", "nvml_used"] and extra["nvml_used"].points == used.points
    # high-water mark per device: 1 GiB in the first bucket, 3 GiB from t = 1002 on; x2 devices
    assert [v for _, v in extra["cuda_peak"].points] == [2 * GiB, 6 * GiB, 6 * GiB]


def test_cpu_run_has_neither(leaky_run: Path) -> None:
    with RunReader(leaky_run) as reader:
        proc = summarize(reader).main_proc
        tl = memory_timeline(reader, 50)
        assert fragmentation(reader, proc) is None
        assert device_used(reader, tl, 50) is None and extra_series(reader, tl, 50) == []


def test_breakdown_for_a_step_uses_that_steps_peak(leaky_run: Path) -> None:
    with RunReader(leaky_run) as reader:
        proc = summarize(reader).main_proc
        measured = breakdown_steps(reader, proc)
        steps = {s["step"]: s for s in reader.steps(proc)}
        row = reader.query("SELECT * FROM step_breakdown WHERE proc = ? AND step = ?", (proc, measured[0]))[0]
        bd = breakdown_for(reader, proc, 15)
    assert measured and bd is not None
    assert bd.source_step == min(measured, key=lambda s: (abs(s - 15), s))
    assert bd.peak_bytes == steps[15]["peak_rss"] and bd.metric == "rss"
    measured_sum = sum(bd.parts[k] for k in ("parameters", "gradients", "optimizer_state", "activations"))
    assert bd.parts["other"] == max(0, steps[15]["peak_rss"] - measured_sum)
    assert bd.parts["parameters"] == row["parameters"]  # parameters do not change between steps


def test_position_is_the_latest_sample(leaky_run: Path) -> None:
    with RunReader(leaky_run) as reader:
        proc = summarize(reader).main_proc
        last = reader.query("SELECT step, phase FROM samples WHERE proc = ? ORDER BY t DESC LIMIT 1", (proc,))[0]
        assert position(reader, proc) == (last["step"], last["phase"])
        assert position(reader, None) == (None, None)
