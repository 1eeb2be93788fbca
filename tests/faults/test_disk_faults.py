"""Real runs on a disk that fills up, a file size limit, a directory that turns read-only.

Whatever happens to recording: memscope exits with the training's own status and no
traceback; the steps it kept have no gap; what was lost is counted and the file (or stderr,
when the file cannot take it) says why and from when; the file stays readable and sound.
"""

from __future__ import annotations

import resource
import shutil
from pathlib import Path

import pytest

from conftest import memscope
from faults.runs import (LOOP, bind, finish, integrity, report, start_attach, steps_recorded, text_report,
                         tmpfs, wait_steps)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# a few seconds of training with fast sampling: a new run file takes about 130 KiB (its
# schema, the -shm), every commit appends a few 4 KiB pages to the -wal: a disk with a few
# dozen KiB to spare fills within the first second
FILLER = (LOOP, "--steps", "400", "--sleep", "0.005", "--exit", "3")
FILLER_OPTIONS = ("--sample-hz", "100")


def check_degraded_run(db: Path, code: int, err: str) -> dict:
    assert code == 3, err  # the training's exit status, whatever happened to recording
    assert "Traceback" not in err, err
    doc = report(db)
    run = doc["run"]
    steps = steps_recorded(db)
    assert steps == list(range(len(steps))), "a gap in the recorded steps"
    assert run["status"] in ("failed", "abandoned"), run
    # why the record is short, in the file; or, when the file took nothing more, on stderr
    said_in_file = bool(run["recording"])
    said_on_stderr = "warning" in err and ("full" in err or "limit" in err)
    assert said_in_file or said_on_stderr, (run, err)
    if run["status"] == "abandoned":  # the end could not be written: stderr says so
        assert "cannot record the end of the run" in err, err
    assert integrity(db) == "ok"
    if Path(str(db) + "-wal").exists() and Path(str(db) + "-wal").stat().st_size:
        assert any("-wal" in note for note in run["recording"]), run  # the -wal is part of it
    assert "still running" not in text_report(db)
    return run


def test_disk_fills_up_during_the_run(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "256k") as disk:
        db = disk / "run.db"
        code, _out, err = finish(start_attach(db, *FILLER, options=FILLER_OPTIONS), timeout=400)
        run = check_degraded_run(db, code, err)
        assert len(steps_recorded(db)) < 400  # the disk did fill up
        assert run["dropped"] > 0 or run["status"] == "abandoned"


def test_file_size_limit_during_the_run(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    limit = 128 * 1024

    def small_files() -> None:  # ulimit -f, for memscope and the training it starts
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    code, _out, err = finish(start_attach(db, *FILLER, options=FILLER_OPTIONS,
                                          preexec_fn=small_files), timeout=400)
    run = check_degraded_run(db, code, err)
    assert len(steps_recorded(db)) < 400
    assert run["dropped"] > 0 or run["status"] == "abandoned"


def test_directory_turns_read_only_during_the_run(tmp_path: Path) -> None:
    where = tmp_path / "runs"
    where.mkdir()
    db = where / "run.db"
    go = tmp_path / "go"  # the training holds before step 5 until the directory is read-only
    with bind(where) as read_only:
        proc = start_attach(db, LOOP, "--steps", "40", "--hold-at", "5", "--hold-file", str(go),
                            "--exit", "3")
        wait_steps(db, 5, proc)
        read_only()
        go.touch()
        code, _out, err = finish(proc)
        assert code == 3 and "Traceback" not in err, err
        assert "cannot record the end of the run" in err and "read-only" in err, err
    # the view is gone: the file as the disk has it
    run = report(db)["run"]
    assert run["status"] == "abandoned" and run["recording"], run  # nobody left to finish it
    assert "still running" not in text_report(db)
    assert integrity(db) == "ok"
    steps = steps_recorded(db)
    assert steps == list(range(len(steps))) and len(steps) >= 5


@pytest.mark.parametrize("free_kib", [16, 48, 96, 128])
def test_create_on_a_nearly_full_disk(tmp_path: Path, free_kib: int) -> None:
    """Creating the run file fails for the real reason and leaves nothing behind; or it
    works, and then the run goes on as any other."""
    with tmpfs(tmp_path / "disk", "1m") as disk:
        filler = disk / "filler"
        with open(filler, "wb") as f:
            f.write(b"\0" * (1024 * 1024 - free_kib * 1024))
        db = disk / "run.db"
        res = memscope("attach", "--headless", "--db", str(db), "--", shutil.which("true") or "/bin/true")
        assert "Traceback" not in res.stderr and "no transaction is active" not in res.stderr
        if res.returncode == 2:
            assert "cannot create run file" in res.stderr and "is full" in res.stderr, res.stderr
            assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # nothing left behind
        else:
            assert res.returncode == 0, res.stderr
            filler.unlink()  # room again: the file it made is a sound run file
            assert report(db)["run"]["status"] in ("finished", "abandoned")
