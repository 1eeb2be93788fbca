"""A directory's files written side by side, this process and child processes (memscope/report/
file_lanes.py): what a failure or an interrupt leaves is what writing them one after the other
would have left, and no temporary file; a failure in a child is raised here as it was raised
there; a child that cannot do its share leaves it to this process."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TextIO

import pytest

from memscope.errors import UserError
from memscope.report import csv_export, file_lanes
from memscope.report.sql_text import lenient_text
from memscope.report.file_lanes import Job, write_files
from memscope.store.reader import RunReader

BIG = file_lanes.ONE_LANE_BELOW  # a cost worth a child
WRITER = f"{__name__}:write"  # a child imports this module (the parent's sys.path is its PYTHONPATH)


def write(reader: RunReader, name: str, out: TextIO) -> int:
    """What each test file name does."""
    if name == "fail.csv":
        out.write("half\n")
        raise UserError(f"damaged in {os.getpid()}")
    if name == "endless.csv":  # minutes of SQLite, unless ended; says its pid first
        (Path(os.environ["LANES_TEST_DIR"]) / "endless.pid").write_text(str(os.getpid()))
        reader.conn.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000000000)"
                            " SELECT count(*) FROM n").fetchone()
    if name == "interrupt.csv":  # Ctrl-C in this process once the child is in its query
        said = Path(os.environ["LANES_TEST_DIR"]) / "endless.pid"
        for _ in range(600):  # the child's start: an interpreter and memscope's imports
            if said.exists():
                break
            time.sleep(0.05)
        time.sleep(0.2)  # from its pid to its query
        raise KeyboardInterrupt
    out.write(f"{name}\n{os.getpid()}\n")
    return 2


@pytest.mark.parametrize("lanes, costs", [(1, (1, 5, 3)), (2, (1, 5, 3)), (2, (5, 3, 1)), (3, (1, 1, 1))])
def test_files_before_the_first_failure_are_left(oom_example_run: Path, tmp_path: Path, lanes: int,
                                                 costs: tuple[int, int, int]) -> None:
    jobs = [Job(n, c * BIG) for n, c in zip(["a.csv", "fail.csv", "c.csv"], costs)]
    with RunReader(oom_example_run) as reader, pytest.raises(UserError, match="damaged in"):
        write_files(reader, str(tmp_path), jobs, WRITER, lanes=lanes)
    assert sorted(os.listdir(tmp_path)) == ["a.csv"] and (tmp_path / "a.csv").read_text().startswith("a.csv\n")


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_every_file_written(oom_example_run: Path, tmp_path: Path, lanes: int) -> None:
    (tmp_path / "b.csv").write_text("an older export\n")  # a regular file: replaced
    jobs = [Job(f"{n}.csv", i * BIG) for i, n in enumerate("abcde")]
    with RunReader(oom_example_run) as reader:
        assert write_files(reader, str(tmp_path), jobs, WRITER, lanes=lanes) == {j.name: 2 for j in jobs}
    assert sorted(os.listdir(tmp_path)) == [j.name for j in jobs]  # no temporary file left
    assert all((tmp_path / j.name).stat().st_mode & 0o777 == 0o600 for j in jobs)  # private, umask or not
    pids = {(tmp_path / j.name).read_text().split()[1] for j in jobs}
    assert len(pids) == lanes and str(os.getpid()) in pids  # this process and its children


@pytest.mark.parametrize("what", ["link", "fifo"])
def test_a_link_or_fifo_at_a_files_name_is_refused_before_anything_is_written(
        oom_example_run: Path, tmp_path: Path, what: str) -> None:
    """The names are memscope's (a table's): a link there is never followed, nor replaced (issue
    34: an export wrote through a link planted at its temporary name)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("someone's file\n")
    if what == "link":
        (tmp_path / "b.csv").symlink_to(elsewhere)
    else:
        os.mkfifo(tmp_path / "b.csv")
    jobs = [Job(f"{n}.csv", i * BIG) for i, n in enumerate("abc")]
    refused = "b.csv: (is a symbolic link|exists and is a FIFO)"
    with RunReader(oom_example_run) as reader, pytest.raises(UserError, match=refused):
        write_files(reader, str(tmp_path), jobs, WRITER, lanes=2)
    assert sorted(os.listdir(tmp_path)) == ["b.csv", "elsewhere"]  # nothing written, nothing left
    assert elsewhere.read_text() == "someone's file\n"


@pytest.mark.parametrize("python", ["/bin/false", "/no/such/python"])  # it fails; it cannot start
def test_a_child_that_cannot_start_leaves_its_share_here(oom_example_run: Path, tmp_path: Path, python: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", python)
    jobs = [Job(f"{n}.csv", BIG) for n in "abc"]
    with RunReader(oom_example_run) as reader:
        assert write_files(reader, str(tmp_path), jobs, WRITER, lanes=2) == {j.name: 2 for j in jobs}
    assert {(tmp_path / j.name).read_text().split()[1] for j in jobs} == {str(os.getpid())}
    # and a failure in its share, done here, is raised as the first in order
    jobs = [Job("a.csv", 3 * BIG), Job("b.csv", BIG), Job("fail.csv", BIG), Job("z.csv", BIG)]
    assert file_lanes._share(jobs, 2)[1] == ["b.csv", "fail.csv"]  # the child's share
    (tmp_path / "out").mkdir()
    with RunReader(oom_example_run) as reader, pytest.raises(UserError, match=f"damaged in {os.getpid()}"):
        write_files(reader, str(tmp_path / "out"), jobs, WRITER, lanes=2)
    assert sorted(os.listdir(tmp_path / "out")) == ["a.csv", "b.csv"]


@pytest.mark.timeout(120)  # a child left running is waited for: minutes, so this test fails
def test_an_interrupt_ends_the_children(oom_example_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANES_TEST_DIR", str(tmp_path))  # where the child says its pid (it inherits this)
    jobs = [Job("a.csv", BIG), Job("endless.csv", 5 * BIG), Job("interrupt.csv", 9 * BIG)]  # the child: endless, a
    assert file_lanes._share(jobs, 2) == [["interrupt.csv"], ["endless.csv", "a.csv"]]
    with RunReader(oom_example_run) as reader, pytest.raises(KeyboardInterrupt):
        write_files(reader, str(tmp_path), jobs, WRITER, lanes=2)
    pid = int((tmp_path / "endless.pid").read_text())
    assert not Path(f"/proc/{pid}").exists()  # ended and reaped, its query not finished
    assert sorted(os.listdir(tmp_path)) == ["endless.pid"]  # and no file of the export


def test_a_small_export_starts_no_child(oom_example_run: Path, tmp_path: Path) -> None:
    jobs = [Job(f"{n}.csv", BIG // 4) for n in "abc"]
    with RunReader(oom_example_run) as reader:
        write_files(reader, str(tmp_path), jobs, WRITER, lanes=2)
    assert {(tmp_path / j.name).read_text().split()[1] for j in jobs} == {str(os.getpid())}


def test_a_real_run_side_by_side(oom_example_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CSV directory of a real run from two lanes (a child writes some of the files): the same
    bytes as from one."""
    out: dict[int, dict[str, bytes]] = {}
    for lanes in (1, 2):
        monkeypatch.setattr(file_lanes, "cores", lambda lanes=lanes: lanes)
        monkeypatch.setattr(file_lanes, "ONE_LANE_BELOW", 0)
        with RunReader(oom_example_run) as reader:
            reader.conn.text_factory = lenient_text
            written = csv_export.write_directory(reader, str(tmp_path / str(lanes)))
        out[lanes] = {name: (tmp_path / str(lanes) / name).read_bytes() for name in written}
    assert out[1] == out[2] and len(out[1]) > 10 and all(out[1].values())
