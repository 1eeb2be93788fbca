"""A live run's file is never replaced or corrupted (issue 21): ``attach --force`` refuses it, a
file moved onto the run path or a deleted run file is noticed and never written into, and
``merge`` refuses inputs still being written. Also: file descriptors exhausted in the training
lose no step."""

from __future__ import annotations

import os
import resource
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SCRIPTS, memscope
from faults.runs import LOOP, finish, integrity, report, start_attach, steps_recorded, wait_steps
from memscope.store.reader import RunReader
from shared_runs import LOOP_STEPS, shared_loop

pytestmark = pytest.mark.timeout(180)


def held(tmp_path: Path, steps: int, at: int) -> tuple[list[str], Path]:
    """The loop's words for a run of ``steps`` that holds before step ``at`` until the returned
    file exists: live for as long as the test needs, then no waiting. The file is made beside
    ``tmp_path``, not in it (a test looks for files left behind there)."""
    go = tmp_path.with_name(f"{tmp_path.name}-go-{at}-{steps}")
    return [LOOP, "--steps", str(steps), "--hold-at", str(at), "--hold-file", str(go)], go


def test_force_refuses_a_live_runs_file(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    words, go = held(tmp_path, 40, 3)
    first = start_attach(db, *words)
    wait_steps(db, 3, first)
    second = memscope("attach", "--headless", "--force", "--db", str(db), LOOP, "--steps", "2")
    go.touch()
    assert second.returncode != 0
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "still being recorded" in lines[0] and "--force" in lines[0], second.stderr
    code, _out, err = finish(first)
    assert code == 0, err
    assert steps_recorded(db) == list(range(40))  # the first run's file, whole
    data = report(db)
    assert data["run"]["command"][-6:-4] == ["--steps", "40"] and data["run"]["status"] == "finished"


def test_force_refuses_a_file_another_process_holds_locked(tmp_path: Path,
                                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    db = tmp_path / "r.db"  # a finished run's file: a copy of the session's loop.py run (tests/shared_runs.py)
    shutil.copy(shared_loop(tmp_path_factory)[0], db)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        res = memscope("attach", "--headless", "--force", "--db", str(db), LOOP, "--steps", "2")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert res.returncode != 0 and "holds a lock" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert steps_recorded(db) == list(range(LOOP_STEPS))
    # once nothing holds it, --force replaces a finished run as before
    assert memscope("attach", "--headless", "--force", "--db", str(db), LOOP, "--steps", "2").returncode == 0
    assert steps_recorded(db) == [0, 1]


@pytest.mark.parametrize("other", ["sqlite", "run"])
def test_a_file_moved_onto_the_run_path_is_never_written(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                                        other: str) -> None:
    db = tmp_path / "r.db"
    stranger = tmp_path / "other.db"
    if other == "run":  # another memscope run, finished: a copy of the session's loop.py run
        shutil.copy(shared_loop(tmp_path_factory)[0], stranger)
    else:
        conn = sqlite3.connect(stranger)
        conn.executescript("CREATE TABLE t (x); INSERT INTO t VALUES (1), (2);")
        conn.close()
    words, go = held(tmp_path, 60, 5)
    run = start_attach(db, *words)
    wait_steps(db, 5, run)
    os.replace(stranger, db)
    go.touch()
    code, _out, err = finish(run)
    assert code == 0
    assert "was replaced by another file during the run" in err and "not touched" in err
    assert integrity(db) == "ok"
    if other == "run":  # still the other run, its own steps and command
        assert steps_recorded(db) == list(range(LOOP_STEPS))
        assert report(db)["run"]["command"][-2:] == ["--steps", str(LOOP_STEPS)]
    else:
        conn = sqlite3.connect(db)
        assert conn.execute("SELECT x FROM t").fetchall() == [(1,), (2,)]
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["t"]
        conn.close()


def test_a_deleted_run_file_is_not_recreated(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    words, go = held(tmp_path, 60, 5)
    run = start_attach(db, *words)
    wait_steps(db, 5, run)
    os.remove(db)
    go.touch()
    code, _out, err = finish(run)
    assert code == 0
    assert "was deleted during the run" in err and "nothing was written in its place" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no new file, no stray -wal / -shm


def test_merge_refuses_inputs_still_being_written(tmp_path: Path) -> None:
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    words, go = held(tmp_path, 40, 2)  # both hold at step 2 until the merges are done
    runs = [start_attach(db, *words) for db in (a, b)]
    for db, run in zip((a, b), runs):
        wait_steps(db, 2, run)
    res = memscope("merge", str(tmp_path / "m.db"), str(a), str(b), "--allow-unrelated")
    assert res.returncode != 0 and not (tmp_path / "m.db").exists()
    line, = res.stderr.strip().splitlines()
    assert "still being written" in line and str(a) in line and str(b) in line and "--allow-live" in line
    res = memscope("merge", str(tmp_path / "m.db"), str(a), str(b), "--allow-unrelated", "--allow-live")
    assert res.returncode == 0, res.stderr
    assert "merged while still being written" in res.stderr and str(a) in res.stderr
    go.touch()
    for run in runs:
        assert finish(run)[0] == 0
    res = memscope("merge", str(tmp_path / "m2.db"), str(a), str(b), "--allow-unrelated")
    assert res.returncode == 0 and "still being written" not in res.stderr
    with RunReader(tmp_path / "m2.db") as reader:
        assert len(reader.steps()) == 80


def test_no_file_descriptor_left_loses_no_step(tmp_path: Path) -> None:
    db = tmp_path / "r.db"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    res = subprocess.run([sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(db),
                          str(SCRIPTS / "fd_exhaust.py"), "25"], cwd=ROOT, text=True,
                         capture_output=True, preexec_fn=limit, timeout=150,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert res.returncode == 0, res.stderr
    assert "trained" in res.stdout  # the script really ran out of descriptors, then trained
    assert steps_recorded(db) == list(range(25))
    data = report(db)
    assert data["run"]["status"] == "finished" and data["run"]["steps"] == 25
    with RunReader(db) as reader:
        steps = reader.steps()
        warnings = [e["message"] for e in reader.events("warning")]
    # The agent reads RSS through a descriptor it opened before the script took the rest: every
    # step's memory is still measured (psutil, which opens /proc each call, failed here before,
    # and the step boundary said so in a warning, as it would for any other reading that fails)
    assert all(s["end_rss"] for s in steps), [s["end_rss"] for s in steps]
    assert not any("Too many open files" in w and "memory reading" in w for w in warnings), warnings
