"""Every file memscope writes for the user, written one safe way (issue 34, items 1 and 3;
memscope/safe_files.py, docs/files.md).

``report --html /dev/null`` as root replaced the machine's /dev/null with a regular file (the
temporary file was renamed over the device); a link planted at an export's temporary name
(``OUT.tmp<pid>``) had its target truncated and overwritten; exports were 0644. Here: outputs
aimed at a device node (made with mknod in a temporary directory, never the real /dev/null)
and at a FIFO are written through and stay what they are; a link the user named is followed,
once, and said; a link at a name memscope chose is refused; temporary files have names no one
can plant; everything is 0600 under umask 022 (0640 with --group-readable, under umask 077 too).

The commands run in this process (memscope.cli.main, as ``python -m memscope`` does) on the
session's examples/oom.py run, except where the claim is about another user.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from memscope.cli import main
from memscope.store.runs import create_run, register_writer
from memscope.store.writer import connect_rw
from second_user import need_second_user, nobody_memscope, nobody_writes, shared_dir

DATA = Path(__file__).resolve().parent / "data"


def run(*args: str) -> tuple[int, str, str]:
    """``memscope ARGS`` in this process: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path | str) -> int:
    return os.lstat(path).st_mode & 0o777


# -- devices and FIFOs ------------------------------------------------------------------------


def _null_device(where: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("mknod needs root (the suite is not root)")
    node = where / "null"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # the null device, in a temp dir
    return node


@pytest.mark.parametrize("command", ["html", "chrome", "csv"])
def test_a_device_is_written_through_never_replaced(oom_example_run: Path, tmp_path: Path, command: str) -> None:
    node = _null_device(tmp_path)
    before = os.lstat(node)
    args = {"html": ["report", str(oom_example_run), "--html", str(node)],
            "chrome": ["export", str(oom_example_run), "--chrome", str(node)],
            "csv": ["export", str(oom_example_run), "--csv", str(node)]}[command]
    if command == "csv":  # a *.csv name is a file; a device given for the timeline is one too
        link = tmp_path / "timeline.csv"
        link.symlink_to(node)
        args[-1] = str(link)
    code, _out, err = run(*args)
    assert code == 0, err
    after = os.lstat(node)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    assert sorted(os.listdir(tmp_path)) == sorted(["null"] + (["timeline.csv"] if command == "csv" else []))


@pytest.mark.parametrize("command", ["html", "chrome"])
def test_a_fifo_is_written_through(oom_example_run: Path, tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    args = (["report", str(oom_example_run), "--html", str(fifo)] if command == "html"
            else ["export", str(oom_example_run), "--chrome", str(fifo)])
    code, _out, err = run(*args)
    reader.join(timeout=30)
    assert code == 0, err
    assert got and (got[0].startswith(b"<!DOCTYPE html>") if command == "html" else got[0].startswith(b"{"))
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.listdir(tmp_path) == ["pipe"]


def test_a_socket_is_refused_in_one_line(oom_example_run: Path, tmp_path: Path) -> None:
    import socket

    where = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(where))
        code, _out, err = run("report", str(oom_example_run), "--html", str(where))
    assert code == 2 and err.count("\n") == 1 and "exists and is a socket; refusing to replace it" in err
    assert stat.S_ISSOCK(os.lstat(where).st_mode)


# -- symbolic links ---------------------------------------------------------------------------


@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_the_user_named_is_followed_and_said(oom_example_run: Path, tmp_path: Path, dangling: bool) -> None:
    real = tmp_path / "real" / "page.html"
    real.parent.mkdir()
    if not dangling:
        real.write_text("an older page\n")
    link = tmp_path / "page.html"
    link.symlink_to(real)
    code, _out, err = run("report", str(oom_example_run), "--html", str(link))
    assert code == 0, err
    assert f"memscope: wrote {real} (through the symbolic link {link})" in err
    assert link.is_symlink() and real.read_text().startswith("<!DOCTYPE html>") and mode(real) == 0o600
    assert os.listdir(real.parent) == ["page.html"]  # no temporary file left beside it


def test_a_link_at_a_name_memscope_chose_is_refused(oom_example_run: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.csv"
    victim.write_text("someone's\n")
    out = tmp_path / "csv"
    out.mkdir()
    (out / "steps.csv").symlink_to(victim)
    code, _out, err = run("export", str(oom_example_run), "--csv", str(out))
    assert code == 2 and err.count("\n") == 1, err
    assert "steps.csv: is a symbolic link" in err and "at a name it chose" in err
    assert victim.read_text() == "someone's\n" and os.listdir(out) == ["steps.csv"]


def test_links_planted_at_the_old_temporary_names_are_never_touched(oom_example_run: Path) -> None:
    """The second user plants links at the names the temporary files had (``OUT.tmp<pid>``) in
    a directory both may write: the outputs are written, the links' targets (the first user's
    files, which the second cannot write) are not."""
    need_second_user()
    with shared_dir(0o1777) as where:
        victim = where / "victim.txt"
        victim.write_text("root's file\n")
        os.chmod(victim, 0o644)
        outs = {"html": where / "out.html", "chrome": where / "trace.json", "csv": where / "t.csv"}
        for out in outs.values():
            res = nobody_ln(victim, Path(f"{out}.tmp{os.getpid()}"))
            assert res == 0
        assert run("report", str(oom_example_run), "--html", str(outs["html"]))[0] == 0
        assert run("export", str(oom_example_run), "--chrome", str(outs["chrome"]), "--csv", str(outs["csv"]))[0] == 0
        assert victim.read_text() == "root's file\n"
        for out in outs.values():
            assert out.stat().st_size > 100 and mode(out) == 0o600 and out.stat().st_uid == 0
            assert Path(f"{out}.tmp{os.getpid()}").is_symlink()  # theirs: left as it is


def nobody_ln(target: Path, link: Path) -> int:
    from second_user import as_nobody

    return as_nobody("ln", "-s", str(target), str(link)).returncode


# -- modes ------------------------------------------------------------------------------------


def _exports(run_file: Path, where: Path, *extra: str) -> list[Path]:
    """Every kind of export of ``run_file`` into ``where``; the files written."""
    where.mkdir()
    assert run("report", str(run_file), "--html", str(where / "r.html"), *extra)[0] == 0
    code, _out, err = run("export", str(run_file), "--chrome", str(where / "t.json"), "--csv",
                          str(where / "tl.csv"), *extra)
    assert code == 0, err
    assert run("export", str(run_file), "--csv", str(where / "dir"), *extra)[0] == 0
    a, b = where / "a.db", where / "b.db"
    shutil.copyfile(run_file, a)
    shutil.copyfile(run_file, b)
    code, _out, err = run("merge", str(where / "m.db"), str(a), str(b), "--allow-unrelated", *extra)
    assert code == 0, err
    code, _out, err = run("import", str(DATA / "cuda_snapshot_built.pickle"), "--db", str(where / "i.db"), *extra)
    assert code == 0, err
    made = [where / n for n in ("r.html", "t.json", "tl.csv", "m.db", "i.db")]
    return made + sorted((where / "dir").iterdir())


def test_every_output_is_private_under_umask_022(oom_example_run: Path, tmp_path: Path) -> None:
    with umask(0o022):
        made = _exports(oom_example_run, tmp_path / "out")
    assert len(made) > 10 and {p.name: mode(p) for p in made} == {p.name: 0o600 for p in made}
    assert mode(tmp_path / "out" / "dir") == 0o700  # the directory export --csv made


def test_group_readable_asks_for_0640_whatever_the_umask(oom_example_run: Path, tmp_path: Path) -> None:
    with umask(0o077):
        made = _exports(oom_example_run, tmp_path / "out", "--group-readable")
    assert {p.name: mode(p) for p in made} == {p.name: 0o640 for p in made}
    assert mode(tmp_path / "out" / "dir") == 0o750


@pytest.mark.parametrize("group", [False, True])
def test_a_live_run_file_and_its_side_files_are_private(tmp_path: Path, group: bool) -> None:
    """The run file as attach and the API make it, its -wal and -shm (SQLite gives them the
    file's mode) and its spill file, while a writer has it open."""
    db = tmp_path / "r.db"
    with umask(0o022):
        create_run(str(db), ["python", "train.py"], group_readable=group)
        proc, made = register_writer(str(db), {"pid": 1, "started": time.time(), "status": "running"})
        conn = connect_rw(str(db))
        conn.execute("INSERT INTO steps (proc, step, start, end, status) VALUES (?, 0, 0, 1, 'ok')", (proc,))
    try:
        assert made is not None
        files = [db, Path(f"{db}-wal"), Path(f"{db}-shm"), Path(made.path)]
        want = 0o640 if group else 0o600
        assert {p.name: mode(p) for p in files} == {p.name: want for p in files}
    finally:
        conn.close()


# -- reading another user's run file ----------------------------------------------------------


def test_another_user_reads_a_group_readable_run_file_and_not_a_private_one(oom_example_run: Path) -> None:
    """The second user, in the file's group, reads a 0640 run file (in a directory they cannot
    write: a finished run needs no -wal or -shm); a 0600 one is refused in one line."""
    need_second_user()
    with shared_dir(0o755) as where:
        shared = where / "shared.db"
        private = where / "private.db"
        for p in (shared, private):
            shutil.copyfile(oom_example_run, p)
            os.chown(p, 0, 65534)  # group nogroup, the second user's
        os.chmod(shared, 0o640)
        os.chmod(private, 0o600)
        res = nobody_memscope("report", str(shared))
        assert res.returncode == 0 and "status    failed" in res.stdout, res.stderr
        res = nobody_memscope("report", str(private))
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert f"{private}: not readable by this user (permission denied)" in res.stderr


def test_another_user_reads_a_live_group_readable_run(tmp_path: Path) -> None:
    """While it is written (-wal and -shm beside it, 0640 like it), in a directory the reader
    cannot write: SQLite opens the -shm read-only."""
    need_second_user()
    with shared_dir(0o755) as where:
        db = where / "live.db"
        create_run(str(db), ["python", "train.py"], group_readable=True)
        os.chown(db, 0, 65534)
        proc, _ = register_writer(str(db), {"pid": os.getpid(), "started": time.time(), "status": "running"})
        conn = connect_rw(str(db))
        try:
            conn.execute("INSERT INTO steps (proc, step, start, end, status) VALUES (?, 0, 0, 1, 'ok')", (proc,))
            assert os.path.exists(f"{db}-shm") and mode(f"{db}-shm") == 0o640
            res = nobody_memscope("report", "--json", str(db))
            assert res.returncode == 0, res.stderr
            assert '"status": "running"' in res.stdout
        finally:
            conn.close()


def test_nobody_writes_helper_makes_their_file(tmp_path: Path) -> None:
    """(The helper the attacks use really writes as the second user.)"""
    need_second_user()
    with shared_dir(0o1777) as where:
        nobody_writes(where / "x", "theirs")
        assert (where / "x").stat().st_uid == 65534 and (where / "x").read_text() == "theirs"


def test_a_link_at_the_dashboards_log_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """attach with the dashboard in the foreground writes the training's output to RUN.db.log,
    a name memscope chose: a link there is refused (attach then runs headless, saying why)."""
    from memscope.cli.tui import Foreground
    from memscope.errors import UserError

    victim = tmp_path / "victim"
    victim.write_text("someone's\n")
    db = tmp_path / "r.db"
    Path(f"{db}.log").symlink_to(victim)
    fg = Foreground(str(db))
    with pytest.raises(UserError, match="r.db.log: is a symbolic link"):
        fg.start()
    assert fg.tui is None and victim.read_text() == "someone's\n"
