"""The run file is created exclusively (issue 34, items 2 and 5).

Nothing created the run file exclusively: with a delay between the existence check and the
create, two attaches wrote two runs into one file, and a failed create's clean-up could delete
the other's file; dangling links planted at the next default names (memscope-<script>-<time>.db)
blocked attach. Here the delay is made for real (MEMSCOPE_TEST_CREATE_DELAY, test-only: between
prepare_path's checks and the O_EXCL create) and the attaches run a command that does not
import torch (the agent never starts: the claim is about the file, and each costs no training).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from memscope.store.runs import (TEST_CREATE_DELAY_ENV, RunFileTaken, create_run, default_db_path,
                                 discard_run, file_id, finish_run)
from memscope.store.schema import RunFileError

DELAY = "1.5"  # seconds between the check and the create: both attaches are inside it


def attach(db: Path | None, marker: Path, *options: str, cwd: Path = ROOT, delay: bool = True) -> subprocess.Popen[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", **({TEST_CREATE_DELAY_ENV: DELAY} if delay else {}))
    where = ["--db", str(db)] if db is not None else []
    return subprocess.Popen([sys.executable, "-m", "memscope", "attach", "--headless", *where, *options, "--",
                             sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"],
                            cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def race(db: Path, tmp_path: Path, *options: str) -> tuple[subprocess.Popen[str], str, subprocess.Popen[str], str]:
    """Two attaches at once on ``db``: (winner, its stderr, loser, its stderr)."""
    procs = [attach(db, tmp_path / f"ran-{i}", *options) for i in (0, 1)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], errs
    w = 0 if procs[0].returncode == 0 else 1
    return procs[w], errs[w], procs[1 - w], errs[1 - w]


def owner(db: Path) -> list[tuple[int, str]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [(r[0], r[1]) for r in conn.execute("SELECT owner_pid, status FROM run")]
    finally:
        conn.close()


def test_of_two_simultaneous_attaches_one_wins_and_the_other_says_who(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    winner, _err, loser, err = race(db, tmp_path)
    assert err.count("\n") == 1, err
    assert err.startswith(f"memscope: error: {db}: created at the same moment by another memscope "
                          f"(pid {winner.pid})"), err
    assert owner(db) == [(winner.pid, "finished")]  # one run in the file, the winner's
    ran = sorted(p.name for p in tmp_path.glob("ran-*"))
    assert len(ran) == 1  # the loser never started its command
    assert oct(os.stat(db).st_mode & 0o777) == "0o600"


def test_force_replaces_still_exclusively(tmp_path: Path) -> None:
    """--force removes what it removed before (a finished run file), then creates exclusively:
    of two, one wins, the other says who, in one line."""
    db = tmp_path / "run.db"
    create_run(str(db), ["python", "old.py"])
    finish_run(str(db), 0, None)
    old = file_id(str(db))
    winner, _err, loser, err = race(db, tmp_path, "--force")
    assert err.count("\n") == 1 and f"(pid {winner.pid})" in err, err
    assert owner(db) == [(winner.pid, "finished")] and file_id(str(db)) != old


def test_clean_up_removes_only_a_file_this_process_made(tmp_path: Path) -> None:
    # something appears at the path after the checks: the create fails, and it stays
    db = tmp_path / "run.db"
    db.write_bytes(b"someone else's file")
    with pytest.raises(RunFileTaken, match="created at the same moment by another process"):
        create_run(str(db), ["python", "train.py"])
    assert db.read_bytes() == b"someone else's file"
    # a file this process made, replaced meanwhile: discard leaves the other file alone
    mine = tmp_path / "mine.db"
    created = create_run(str(mine), ["python", "train.py"])
    other = tmp_path / "other"
    other.write_text("theirs")
    os.replace(other, mine)
    discard_run(str(mine), created)
    assert mine.read_text() == "theirs"
    # and its own file it does remove
    os.remove(mine)
    created = create_run(str(mine), ["python", "train.py"])
    discard_run(str(mine), created)
    assert not mine.exists() and os.listdir(tmp_path) == ["run.db"]


def test_a_link_at_the_path_is_never_created_through(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.db"
    link = tmp_path / "run.db"
    link.symlink_to(target)  # after the checks (a link is refused by them: test_attach_paths)
    with pytest.raises(RunFileError, match="a symbolic link appeared at this path"):
        create_run(str(link), ["python", "train.py"])
    assert not target.exists() and link.is_symlink()


def test_planted_default_names_move_to_an_unpredictable_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dangling links at the next minute's default names (and a -wal at the first): attach
    takes a name with a random suffix instead of failing, and touches none of them."""
    monkeypatch.chdir(tmp_path)  # default names are in the working directory
    command = [sys.executable, "-c", "pass"]
    now = time.time()
    planted = []
    for s in range(60):
        name = tmp_path / default_db_path(command, now + s)
        if not os.path.lexists(name):
            name.symlink_to(tmp_path / "nowhere" / name.name)
            planted.append(name)
    Path(f"{planted[0]}-wal").write_bytes(b"x")
    chosen = default_db_path(command, now)
    stem = planted[0].name[:-len(".db")]
    assert chosen.startswith(stem + "-") and len(chosen) == len(stem) + 1 + 8 + 3
    proc = attach(None, tmp_path / "ran", cwd=tmp_path, delay=False)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    made = [p for p in tmp_path.glob("memscope-*.db") if not p.is_symlink()]
    assert len(made) == 1 and made[0].name not in {p.name for p in planted}, made
    assert all(p.is_symlink() for p in planted) and not (tmp_path / "nowhere").exists()
    assert (tmp_path / "ran").exists()
