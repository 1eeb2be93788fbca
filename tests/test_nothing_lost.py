"""Nothing is lost without a word: each case a real training under ``memscope attach``.

- memscope's thread cannot start in the training (a second user whose RLIMIT_NPROC is spent,
  tests/scripts/thread_limit.py): an ``agent_failed`` event and a recording line, the process
  ended as ``stopped``, the training's exit status unchanged; and where even the agent could not
  write, the supervisor says the process's recording never started.
- the disk fills up mid-run (a small tmpfs): every step is in the file or counted as lost, with
  the reason, in ``run.dropped`` and an event (memscope/store/reserve.py keeps room for it).
- ``os.execv`` mid-run (tests/scripts/exec_midrun.py): the steps before it are all in the file,
  an ``exec`` event says where the record ends, the new program is a process of its own.
- children made by ``os.fork`` (tests/scripts/fork_trains.py): one that imports torch itself is
  recorded as its own process, its rows flushed though it ends with ``os._exit``; one that trains
  with the torch it inherited is named as a child that trained unrecorded.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, SCRIPTS, memscope
from faults.runs import LOOP, finish, integrity, report, start_attach, steps_recorded, tmpfs, wait_steps
from memscope.store.runs import create_run, finish_run, register_process

SECOND_UID = 48213  # a user with no other process on the machine: its RLIMIT_NPROC is ours to spend


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _second_user_python(env: dict[str, str]) -> str:
    """An interpreter the second user can start and import torch with (this one may live where
    that user cannot look: then the system's Python of the same version, with our packages)."""
    version = "python%d.%d" % sys.version_info[:2]
    candidates = [sys.executable, shutil.which(version) or "", f"/usr/bin/{version}"]
    for python in dict.fromkeys(c for c in candidates if c):
        check = "import os, sys, torch, memscope; sys.exit(not os.path.exists(sys.executable))"
        probe = subprocess.run(["setpriv", f"--reuid={SECOND_UID}", f"--regid={SECOND_UID}", "--clear-groups",
                                python, "-c", check], env=env, capture_output=True, text=True, timeout=120)
        if probe.returncode == 0:
            return python
    pytest.fail(f"no Python the second user (uid {SECOND_UID}) can start with torch and memscope: "
                f"tried {candidates}")


def test_a_thread_that_cannot_start_is_said(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to run the training as a second user whose thread limit binds")
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is missing: it runs the training as the second user")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tui"), sysconfig.get_paths()["purelib"]]))
    python = _second_user_python(env)
    where = Path(tempfile.mkdtemp(prefix="memscope-nproc-", dir="/tmp"))  # the second user's to write in
    try:
        where.chmod(0o777)
        db = where / "run.db"
        res = subprocess.run(["setpriv", f"--reuid={SECOND_UID}", f"--regid={SECOND_UID}", "--clear-groups",
                              python, "-m", "memscope", "attach", "--headless", "--db", str(db),
                              str(SCRIPTS / "thread_limit.py")],
                             env=env, capture_output=True, text=True, timeout=300, cwd=where)
        assert res.returncode == 0, res.stderr  # 4: a thread could still start (the limit did not bind)
        assert "Traceback" not in res.stderr
        events = rows(db, "SELECT kind, message, data FROM events WHERE kind = 'agent_failed'")
        assert len(events) == 1, rows(db, "SELECT kind, message FROM events")
        data = json.loads(events[0][2])
        assert data["error"] == "RuntimeError: can't start new thread"
        assert rows(db, "SELECT status FROM processes") == [("stopped",)]  # ended, not lost
        doc = report(db)
        assert doc["run"]["status"] == "finished" and doc["run"]["exit_code"] == 0
        assert any("memscope's thread could not start (RuntimeError: can't start new thread)" in line
                   for line in doc["run"]["recording"]), doc["run"]["recording"]
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_the_supervisor_says_it_when_the_agent_could_not(tmp_path: Path) -> None:
    """A process its agent registered and then never wrote for (its thread never ran and it
    could not write a word itself): the supervisor's end of the run names it."""
    db = str(tmp_path / "run.db")
    started = time.time() - 30
    create_run(db, ["python", "train.py"], started=started)
    register_process(db, {"pid": 4242, "started": started, "heartbeat": started, "status": "running"})
    register_process(db, {"pid": 4343, "started": started, "heartbeat": started + 20, "status": "running"})
    finish_run(db, exit_code=0, signal=None)
    lines = report(db)["run"]["recording"]
    assert [line for line in lines if "never started" in line] == [
        next(line for line in lines if line.startswith("of pid 4242 never started: its agent registered"))]


def test_a_full_disk_counts_every_step_it_could_not_keep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = 1000
    # a small reserve: room for some of the rows waiting at the end (32 KiB over the 128 KiB kept
    # for the count and the run's end), not for the steps after the disk filled (the rest: lost)
    monkeypatch.setenv("MEMSCOPE_RESERVE_BYTES", str(160 * 1024))
    with tmpfs(tmp_path / "disk", "1m") as disk:
        db = disk / "run.db"
        go = tmp_path / "go"  # before step 5 the training waits until the disk is full
        proc = start_attach(db, LOOP, "--steps", str(steps), "--hold-at", "5", "--hold-file", str(go),
                            "--exit", "3", options=("--sample-hz", "100"))
        wait_steps(db, 5, proc)
        fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:  # every block the disk has left
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        go.touch()
        code, _out, err = finish(proc, timeout=300)
        assert code == 3 and "Traceback" not in err, err
        assert not list(disk.glob("run.db-reserve-*"))  # the room kept was given back
        kept = steps_recorded(db)
        assert kept == list(range(len(kept)))  # no gap
        counts = [json.loads(d) for (d,) in rows(db, "SELECT data FROM events WHERE kind = 'recording_incomplete'")]
        (lost_steps,) = [c["lost_steps"] for c in counts if "lost_steps" in c]  # the writer's count
        assert lost_steps > 0 and len(kept) + lost_steps == steps, (len(kept), lost_steps)
        run = report(db)["run"]
        assert run["status"] == "failed" and run["exit_code"] == 3  # the end is in the file
        assert run["dropped"] >= lost_steps
        assert any(f"incomplete: {lost_steps} steps" in line and "full" in line for line in run["recording"]), run
        assert integrity(db) == "ok"


def test_execv_mid_run_flushes_first(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    res = memscope("attach", "--headless", "--db", str(db), str(SCRIPTS / "exec_midrun.py"), timeout=300)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    procs = rows(db, "SELECT id, pid, status FROM processes ORDER BY id")
    assert len(procs) == 2 and procs[0][1] == procs[1][1]  # one pid, two programs
    assert [p[2] for p in procs] == ["stopped", "stopped"]
    assert rows(db, "SELECT proc, count(*), max(step) FROM steps GROUP BY proc ORDER BY proc") == [
        (procs[0][0], 6, 5), (procs[1][0], 3, 2)]  # every step before the exec
    ((message, data),) = rows(db, "SELECT message, data FROM events WHERE kind = 'exec'")
    assert "replaced its program with os.execv" in message and json.loads(data)["argv"][-2:] == ["--token", "***"]
    assert b"EXECSECRET" not in db.read_bytes()  # the exec's command is stored redacted


def test_forked_children_recorded_or_named(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    res = memscope("attach", "--headless", "--db", str(db), str(SCRIPTS / "fork_trains.py"), timeout=300)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    procs = rows(db, "SELECT id, pid, status FROM processes ORDER BY id")
    steps = dict(rows(db, "SELECT proc, count(*) FROM steps GROUP BY proc"))
    # the child that imported torch itself: its own process, every step in the file (os._exit)
    (child,) = [p for p in procs if steps.get(p[0]) == 4]
    assert child[2] == "stopped"
    parent = next(p for p in procs if p[0] != child[0])
    ((message, data),) = rows(db, "SELECT message, data FROM events WHERE kind = 'agent_missing'")
    assert json.loads(data)["parent"] == parent[1] and f"forked from pid {parent[1]} (os.fork)" in message
    assert any("trains (its optimizer stepped) but is not recorded" in line
               for line in report(db)["run"]["recording"])
