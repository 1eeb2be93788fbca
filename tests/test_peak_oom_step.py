"""Which step is the peak when the run ran out of memory (issue #14 item 3).

Host RSS is sampled and the peaks of a steady loop's steps differ by up to 2%, so
the step that failed may read a little lower than the step before it although it asked for more
than there was. Run files are written here as the agent's writer leaves them, with the readings
chosen, so each side of the rule is checked on every run (a real census run lands on either
side by chance).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import report_json

MiB = 2 ** 20


def write_run(tmp_path: Path, peaks: list[int], oom_step: int | None) -> Path:
    """One CPU process whose steps peaked at ``peaks``; the last step failed with an allocator
    error at ``oom_step`` (None: no OOM, every step ok)."""
    from memscope.store.runs import create_run, finish_run, register_process
    from memscope.store.writer import connect_rw

    db = tmp_path / "run.db"
    t0 = time.time()
    create_run(str(db), ["python", "train.py"], started=t0)
    proc = register_process(str(db), {"pid": 1, "argv": json.dumps(["train.py"]), "device": "cpu",
                                      "torch": "2.x", "started": t0, "status": "stopped"})
    conn = connect_rw(str(db))
    with conn:
        for i, peak in enumerate(peaks):
            failed = oom_step is not None and i == len(peaks) - 1
            conn.execute("INSERT INTO steps (proc, step, start, end, peak_rss, status) VALUES (?, ?, ?, ?, ?, ?)",
                         (proc, i, t0 + i, t0 + i + 1, peak, "failed" if failed else "ok"))
        if oom_step is not None:
            data = {"step": oom_step, "phase": "forward", "requested_bytes": 64 * MiB,
                    "message": "DefaultCPUAllocator: can't allocate memory"}
            conn.execute("INSERT INTO events (proc, t, step, kind, message, data) VALUES (?, ?, ?, 'oom', ?, ?)",
                         (proc, t0 + len(peaks), oom_step, data["message"], json.dumps(data)))
    conn.close()
    finish_run(str(db), exit_code=1 if oom_step is not None else 0, signal=None)
    return db


def test_the_failing_step_is_the_peak_within_five_percent(tmp_path: Path) -> None:
    # step 2 failed reading 4.7% below step 1: it held about as much and asked for more
    db = write_run(tmp_path, [900 * MiB, 1049 * MiB, 1000 * MiB], oom_step=2)
    assert report_json(db)["peak"]["step"] == 2
    assert report_json(db)["peak"]["bytes"] == 1000 * MiB  # its own reading, not the other step's


def test_a_failing_step_just_over_five_percent_below_is_not_the_peak(tmp_path: Path) -> None:
    db = write_run(tmp_path, [900 * MiB, 1054 * MiB, 1000 * MiB], oom_step=2)  # 5.1% below
    assert report_json(db)["peak"]["step"] == 1


def test_a_failing_step_far_below_the_peak_is_not_the_peak(tmp_path: Path) -> None:
    # step 2 failed early, holding half of what step 1 did: step 1 stays the peak
    db = write_run(tmp_path, [900 * MiB, 1000 * MiB, 500 * MiB], oom_step=2)
    doc = report_json(db)
    assert doc["peak"]["step"] == 1 and doc["peak"]["bytes"] == 1000 * MiB
    assert doc["oom"]["step"] == 2


def test_without_an_oom_the_earliest_highest_step_is_the_peak(tmp_path: Path) -> None:
    db = write_run(tmp_path, [900 * MiB, 1004 * MiB, 1000 * MiB, 1004 * MiB], oom_step=None)
    assert report_json(db)["peak"]["step"] == 1
