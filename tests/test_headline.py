"""``attach``'s closing line comes from :func:`memscope.analysis.summary.headline`, which skips the
analyses the line does not show: on every kind of real run file its line must be the line the
whole summary gives (a leaking run, an OOM, two ranks, a run whose writer folded steps, and
copies with lost rows and an abandoned record)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from memscope.analysis.summary import headline, summarize
from memscope.report.text import render_headless
from memscope.store.reader import RunReader
from conftest import SCRIPTS, memscope
from shared_runs import shared_attach, shared_ddp


def _lines(db: Path) -> tuple[str, str]:
    with RunReader(db) as reader:
        return render_headless(headline(reader)), render_headless(summarize(reader))


@pytest.fixture(scope="module")
def leaky(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db, out = shared_attach(tmp_path_factory, [], ["examples/leaky.py", "--steps", "40"])
    assert out.returncode == 0, out.stderr
    return db


def test_a_leaking_run(leaky: Path) -> None:
    brief, whole = _lines(leaky)
    assert brief == whole
    assert " · 40 steps · peak " in brief and " at step " in brief and brief.endswith(" · finished")


def test_an_oom_run(oom_example_run: Path) -> None:
    brief, whole = _lines(oom_example_run)
    assert brief == whole
    assert " · 3 steps · " in brief and " at step 3 " in brief  # the failing step is the peak


def test_two_ranks(tmp_path_factory: pytest.TempPathFactory) -> None:
    db, out = shared_ddp(tmp_path_factory, "--steps", "3", "--heavy-rank", "1", "--heavy-mb", "64")
    assert out.returncode == 0, out.stderr
    brief, whole = _lines(db)
    assert brief == whole and " · 3 steps · " in brief


def test_lost_rows_and_an_abandoned_record(leaky: Path, tmp_path: Path) -> None:
    db = tmp_path / "copy.db"
    shutil.copy(leaky, db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE processes SET dropped = 7")
        conn.execute("UPDATE run SET status = 'running', ended = NULL")  # nobody left writing it
    brief, whole = _lines(db)
    assert brief == whole
    assert " · 40 steps · " in brief and "7 rows dropped" in brief and "memscope: recording abandoned" in brief


def test_a_run_whose_writer_folded_steps(tmp_path: Path) -> None:
    """Steps a long run's writer folded into windows count (small thresholds from the
    environment, as tests/test_file_growth.py does)."""
    db = tmp_path / "run.db"
    env = {"MEMSCOPE_FOLD_AFTER": "30", "MEMSCOPE_FOLD_EVERY_S": "0.1", "MEMSCOPE_FOLD_WINDOW_S": "1e9",
           "MEMSCOPE_FOLD_TAIL": "30"}
    out = memscope("attach", "--headless", "--db", str(db), "--inventory-every", "40", "--inventory-budget", "0",
                   str(SCRIPTS / "loop.py"), "--steps", "300", env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT sum(steps) FROM step_windows").fetchone()[0] > 0
    brief, whole = _lines(db)
    assert brief == whole and " · 300 steps · " in brief
    assert brief in out.stderr + out.stdout  # what attach printed
