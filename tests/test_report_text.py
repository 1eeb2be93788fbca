"""``memscope report``'s text: the breakdown line says which step it was measured at, and the
notes print sizes for people, on real runs of tests/scripts/loop.py under ``memscope attach``."""

from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from conftest import SCRIPTS, cli, memscope, report_json
from memscope.units import human_bytes
from shared_runs import LOOP_STEPS, shared_loop


def attach(db: Path, *options: str) -> None:
    res = memscope("attach", "--headless", "--db", str(db), *options, str(SCRIPTS / "loop.py"),
                   "--steps", str(LOOP_STEPS))
    assert res.returncode == 0, res.stderr


def line(text: str, head: str) -> str:
    (found,) = [x for x in text.splitlines() if x.startswith(head)]
    return found


def breakdown_steps(db: Path) -> list[int]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT step FROM step_breakdown ORDER BY step")]


@pytest.mark.parametrize("every", [None, "1"], ids=["default-cadence", "every-step"])
def test_breakdown_line_names_its_step(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                      every: str | None) -> None:
    """Default cadence: one profiled step, usually not where the peak is; every step profiled:
    the breakdown is the peak step's own. Either way the line says which step. (At the default
    cadence the session's loop.py run, read only: tests/shared_runs.py.)"""
    if every:
        db = tmp_path / "run.db"
        attach(db, "--layers-every", every)
    else:
        db, _ = shared_loop(tmp_path_factory)
    peak_step = report_json(db)["peak"]["step"]
    measured = breakdown_steps(db)
    assert measured
    text = cli("report", str(db)).stdout
    bd = line(text, "breakdown ")
    if peak_step is None:  # host RSS can peak outside every step (start-up, shutdown) on a busy machine
        assert bd.endswith(f" (measured at profiled step {measured[-1]})"), bd
    elif every:
        assert peak_step in measured
        assert bd.endswith(f" (measured at step {peak_step}, the peak's step)"), bd
    elif peak_step == 1:  # the default profiles step 1 only
        assert measured == [1] and bd.endswith(" (measured at step 1, the peak's step)"), bd
    else:  # loop.py's host RSS usually peaks later
        assert measured == [1]
        assert bd.endswith(f" (measured at profiled step 1, not at the peak's step {peak_step})"), bd


def test_pending_wal_note_in_human_units(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A finished run's -wal that was never folded in (a copy taken with a reader still writing):
    the note says how big, in units a person reads. (A copy of the session's loop.py run.)"""
    db = tmp_path / "run.db"
    shutil.copy(shared_loop(tmp_path_factory)[0], db)
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode = WAL").fetchone() == ("wal",)
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("INSERT INTO events (proc, t, step, kind, message, data) "
                     "VALUES (NULL, 0, NULL, 'note', 'kept in the -wal', NULL)")
        conn.commit()
        size = (tmp_path / "run.db-wal").stat().st_size
        assert size > 1024
        text = cli("report", str(db)).stdout
    finally:
        conn.close()
    note = line(text, "recording ")
    assert f"run.db-wal ({human_bytes(size)}) belongs to this run file" in note, note
    assert not re.search(r"\d{4,}", note.replace(str(tmp_path), "")), note
