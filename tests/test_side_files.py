"""Side files only memscope made, for this run (issue 34, item 1).

A spill file another user wrote beside a run file was replayed into it at the end of the run:
forged rows (an ``oom`` event, step 999999), its text run as SQL (``UPDATE processes SET
argv=...``), a recursive query that left attach at 100% CPU; a symbolic link at the spill path
made the appends go to its target. Now a spill file is made by its writer, exclusively, with a
random token the run file records (with its owner, inode and pid), and replayed only as rows
checked against the schema (memscope/store/spill.py).

One real run for the attacks of the second user (``planted``): a lock holds the run file past
the end of the training, so its last rows wait in its spill file and attach's supervisor
replays them, while three files the second user wrote beside it wait there too.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from faults.runs import (LOOP, Lock, finish, listen, start_attach, steps_recorded, training_gone, wait_steps,
                         wait_until)
from memscope.store import spill
from memscope.store.reader import RunReader
from memscope.store.runs import create_run, finish_run, register_writer
from memscope.store.writer import RunWriter, connect_rw
from second_user import as_nobody, need_second_user, nobody_writes, shared_dir

pytestmark = pytest.mark.timeout(180)

STEPS = 40
# What the second user plants (the attacks): rows, SQL text, a query that never ends
FORGED_ROWS = "\n".join([
    json.dumps({"t": "events", "r": {"proc": 1, "t": 1.0, "step": 5, "kind": "oom",
                                     "message": "FORGED out of memory", "data": "{}"}}),
    json.dumps({"t": "steps", "r": {"proc": 1, "step": 999999, "start": 0.0, "end": 1.0, "status": "ok",
                                    "peak_rss": 100_000_000_000_000}}),
]) + "\n"
SQL_TEXT = json.dumps({"x": "UPDATE processes SET argv='[\"INJECTED-ARGV\"]'", "p": []}) + "\n"
ENDLESS = json.dumps({"x": "UPDATE processes SET argv = (WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL "
                           "SELECT i + 1 FROM c) SELECT max(i) FROM c)", "p": []}) + "\n"
PLANTS = {"1": FORGED_ROWS, "2": SQL_TEXT, "3": ENDLESS}


@pytest.fixture(scope="module")
def planted() -> Iterator[dict[str, Any]]:
    """The run: held at step 20, locked, the files planted by the second user, the last 20
    steps trained behind the lock, the training ended, then the lock released."""
    need_second_user()
    with shared_dir(0o1777) as where:
        db = where / "run.db"
        go_on = where / "go-on"
        proc = start_attach(db, LOOP, "--steps", str(STEPS), "--hold-at", "20", "--hold-file", str(go_on),
                            env_extra={"MEMSCOPE_BUSY_TIMEOUT": "0.3", "MEMSCOPE_SPILL_AFTER": "40"})
        wait_steps(db, 20, proc)
        lock = Lock(db)
        try:
            for name, text in PLANTS.items():
                nobody_writes(f"{db}-spill-{name}", text)
            said, waits = listen(proc, "is locked by another process")
            go_on.touch()
            wait_until(lambda: training_gone(proc.pid), timeout=90, what="the training to end")
            assert waits.wait(timeout=60), "".join(said)
            ours = [p for p in spill.spill_files(str(db)) if p.rsplit("-", 1)[1] not in PLANTS]
            waiting = sum(os.path.getsize(p) for p in ours)
            modes = {os.path.basename(p): os.stat(p).st_mode & 0o777 for p in [db, f"{db}-wal", *ours]}
        finally:
            lock.release()
        released = time.monotonic()
        code, _out, err = finish(proc, timeout=60)
        yield {"db": db, "code": code, "stderr": "".join(said) + err, "after_release": time.monotonic() - released,
               "ours": ours, "waiting": waiting, "left": sorted(os.listdir(where)), "modes": modes}


def test_planted_spill_files_are_never_replayed(planted: dict[str, Any]) -> None:
    db = planted["db"]
    assert planted["code"] == 0, planted["stderr"]
    assert planted["ours"] and planted["waiting"] > 200  # this run's own rows did wait in its file
    assert set(planted["modes"].values()) == {0o600}, planted["modes"]  # attach's run file, -wal, spill file
    # the run's figures are the training's: every step once, none forged, no OOM, argv untouched
    assert steps_recorded(db) == list(range(STEPS))
    with RunReader(db) as reader:
        assert reader.events("oom") == []
        procs = reader.processes()
        assert [p["status"] for p in procs] == ["stopped"]  # its last word came through its own spill file
        assert "INJECTED" not in str(procs[0]["argv"]) and "loop.py" in str(procs[0]["argv"])
        (ignored,) = reader.events("side_files_ignored")
        assert any("written then" in e["message"] for e in reader.events("recording_recovered"))
    names = {f["path"] for f in ignored["data"]["files"]}
    assert names == {f"{db}-spill-{n}" for n in PLANTS}
    assert all(f["why"] == "not made by this run" for f in ignored["data"]["files"])


def test_they_are_named_in_one_warning_and_left_alone(planted: dict[str, Any]) -> None:
    db = planted["db"]
    lines = [ln for ln in planted["stderr"].splitlines() if "did not make" in ln]
    assert len(lines) == 1, planted["stderr"]
    assert lines[0].startswith("memscope: warning: ignored 3 file(s) beside")
    assert all(f"{db}-spill-{n}" in lines[0] for n in PLANTS)
    # the other user's files are theirs: not removed; this run's own spill file is gone
    assert planted["left"] == ["go-on", "run.db", *(f"run.db-spill-{n}" for n in sorted(PLANTS))]


def test_a_query_in_a_planted_file_never_runs(planted: dict[str, Any]) -> None:
    # the recursive statement would run until killed (SIGINT did not stop it); the end of the
    # run is written within seconds of the lock going
    assert planted["after_release"] < 30, planted["after_release"]


# -- in this process: the rules of replay, one by one -----------------------------------------


def _run(db: Path) -> tuple[int, spill.SpillFile]:
    create_run(str(db), ["python", "train.py"])
    proc, made = register_writer(str(db), {"pid": os.getpid(), "started": time.time(), "status": "running"})
    assert made is not None
    return proc, made


def _step(proc: int, n: int) -> str:
    return spill.encode_insert("steps", {"proc": proc, "step": n, "start": float(n), "end": n + 0.5, "status": "ok"})


def test_the_spill_file_is_made_private_exclusive_and_recorded(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    proc, made = _run(db)
    st = os.lstat(made.path)
    assert oct(st.st_mode & 0o777) == "0o600" and st.st_uid == os.geteuid()
    name = os.path.basename(made.path)
    assert name.startswith("r.db-spill-") and len(name) == len("r.db-spill-") + 2 * spill.TOKEN_BYTES
    first = Path(made.path).read_text().splitlines()[0]
    assert json.loads(first) == {"memscope_spill": 1, "token": made.token, "pid": os.getpid(), "proc": proc}
    conn = sqlite3.connect(db)
    (rec,) = spill.recorded(conn)
    conn.close()
    assert rec == {"proc": proc, "name": name, "token": made.token, "uid": os.geteuid(),
                   "file_id": f"{st.st_dev}:{st.st_ino}", "pid": os.getpid()}


def test_replay_writes_only_checked_rows(tmp_path: Path) -> None:
    """Rows of memscope's schema, of this file's process, with values of the columns' types;
    every other line is counted and named, never written, never run."""
    db = tmp_path / "r.db"
    proc, made = _run(db)
    other, _ = register_writer(str(db), {"pid": 2, "started": time.time(), "status": "running"})
    made.append([
        _step(proc, 0),
        SQL_TEXT.strip(),  # SQL text
        spill.encode_insert("steps", {"proc": other, "step": 7, "start": 0.0, "end": 1.0, "status": "ok"}),
        spill.encode_insert("run", {"id": 2, "command": "[]", "started": 0.0, "status": "finished"}),
        spill.encode_insert("sqlite_master", {"type": "table"}),
        spill.encode_insert("steps", {"proc": proc, "step": "1; DROP TABLE steps", "start": 0.0, "end": 1.0,
                                      "status": "ok"}),  # a text where a number goes
        spill.encode_insert("steps", {"proc": proc, "step": 2, "start": 0.0, "end": 1.0, "status": None}),  # NOT NULL
        spill.encode_insert("steps", {"proc": proc, "step": 3, "start": 0.0, "end": 1.0, "status": "ok",
                                      "evil": 1}),  # a column memscope does not have
        '{"t": "steps", "r": {"proc": 1, "step": 4, "start": 0, "end": 1, "status": "ok", "x) --": 1}}',
        spill.encode_update("processes", {"id": other}, {"status": "stopped"}),  # another process's row
        spill.encode_update("processes", {"id": proc}, {"argv": "INJECTED"}),  # not a column it updates
        spill.encode_update("run", {"id": 1}, {"status": "finished"}),
        spill.encode_update("processes", {"id": proc}, {"status": "stopped", "ended": 5.0}),
        _step(proc, 1),
    ])
    conn = connect_rw(str(db))
    try:
        out = spill.replay_all(str(db), conn)
    finally:
        conn.close()
    assert out.rows == 3 and out.refused == 11 and out.ignored == [] and out.stopped is None
    with RunReader(db) as reader:
        assert [s["step"] for s in reader.steps(proc)] == [0, 1] and reader.steps(other) == []
        assert {p["id"]: p["status"] for p in reader.processes()} == {proc: "stopped", other: "running"}
        assert reader.run()["status"] == "running" and "INJECTED" not in str(reader.processes())
    assert not os.path.exists(made.path)  # replayed: removed


def test_a_changed_first_line_is_not_this_runs_file(tmp_path: Path) -> None:
    """The right name, the right owner and inode, another token inside: ignored, kept."""
    db = tmp_path / "r.db"
    proc, made = _run(db)
    made.append([_step(proc, 0)])
    text = Path(made.path).read_text().replace(made.token, "0" * len(made.token))
    with open(made.path, "r+") as f:  # the same file (inode), rewritten
        f.write(text)
    ignored: list[str] = []
    finish_run(str(db), 0, None, ignored=ignored)
    assert ignored == [f"{made.path} (its first line does not carry this run's token)"]
    assert steps_recorded(db) == [] and os.path.exists(made.path)


def test_replay_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "r.db"
    proc, made = _run(db)
    made.append([_step(proc, n) for n in range(50)])
    monkeypatch.setattr(spill, "MAX_REPLAY_ROWS", 10)
    finish_run(str(db), 0, None)
    assert steps_recorded(db) == list(range(10))
    with RunReader(db) as reader:
        assert any("replay stopped at 10 rows" in e["message"] for e in reader.events("recording_incomplete"))
    _, made = register_writer(str(db), {"pid": 3, "started": time.time(), "status": "running"})
    assert made is not None
    monkeypatch.setattr(spill, "MAX_REPLAY_S", 0.0)
    made.append([_step(made.proc or 0, n) for n in range(5)])
    conn = connect_rw(str(db))
    try:
        assert spill.replay_all(str(db), conn).rows == 0  # out of time before the first row
    finally:
        conn.close()


def test_another_users_file_at_the_recorded_name_is_ignored(tmp_path: Path) -> None:
    """In a directory where the second user may remove the first user's files (0777), they put
    their own file, with a first line of their own, at the spill file's name."""
    need_second_user()
    with shared_dir(0o777) as where:
        db = where / "r.db"
        proc, made = _run(db)
        res = as_nobody("rm", "-f", made.path)
        assert res.returncode == 0, res.stderr
        nobody_writes(made.path, json.dumps({"memscope_spill": 1, "token": "f" * 32, "pid": 1, "proc": proc})
                      + "\n" + FORGED_ROWS)
        ignored: list[str] = []
        finish_run(str(db), 0, None, ignored=ignored)
        assert ignored == [f"{made.path} (owned by uid 65534, not {os.geteuid()} who made it)"]
        assert steps_recorded(db) == []
        with RunReader(db) as reader:
            assert reader.events("oom") == [] and reader.events("side_files_ignored")


def test_a_link_put_at_the_spill_file_is_never_written_through(tmp_path: Path) -> None:
    """The second user replaces a live writer's spill file with a symbolic link to a file the
    first user can write and they cannot: the rows that would have waited are counted as lost
    (with the reason), the link's target is untouched, and nothing is replayed through it."""
    need_second_user()
    victim = tmp_path / "victim.txt"  # root's, in a directory nobody cannot enter
    victim.write_text("root's file\n")
    with shared_dir(0o777) as where:
        db = where / "r.db"
        proc, made = _run(db)
        res = as_nobody("sh", "-c", 'rm -f "$1" && ln -s "$2" "$1"', "sh", made.path, str(victim))
        assert res.returncode == 0, res.stderr
        writer = RunWriter(str(db), flush_interval=0.02, busy_timeout=0.1, spill_after=5)
        writer.proc_id = proc
        writer.use_spill(made)
        writer.start()
        lock = Lock(db)
        try:
            for n in range(30):
                writer.insert("steps", {"proc": proc, "step": n, "start": float(n), "end": n + 0.5, "status": "ok"})
            wait_until(lambda: writer.lost_steps > 0, timeout=30, what="a refused spill")
        finally:
            lock.release()
        writer.close()
        assert victim.read_text() == "root's file\n"
        ignored: list[str] = []
        finish_run(str(db), 0, None, ignored=ignored)
        assert ignored == [f"{made.path} (a symbolic link)"]
        kept = steps_recorded(db)
        assert writer.lost_steps == 30 - len(kept) > 0
        with RunReader(db) as reader:
            assert any("spill file" in e["message"] and "steps lost" in e["message"]
                       for e in reader.events("recording_degraded"))
