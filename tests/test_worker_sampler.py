"""The supervisor's DataLoader-worker sampler (memscope.runners.workers) on real processes: a
forked child (the same command line as its parent, as a DataLoader worker with ``fork``) is
sampled at the young cadence right after it is found, and a sample that cannot be written is
counted and said in a ``recording_degraded`` event, never lost silently."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from memscope.runners import workers
from memscope.runners.workers import WorkerSampler
from memscope.store.schema import migrate

FORKS = '''
import os, sys, time
if os.fork() == 0:
    time.sleep(60); os._exit(0)
print("forked", flush=True)
time.sleep(60)
'''


@pytest.fixture
def parent(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    script = tmp_path / "forks.py"
    script.write_text(FORKS)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "forked"
    yield proc
    import os
    import signal
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_file(path: Path, pid: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn)
    conn.execute("INSERT INTO processes (pid, argv, started, status) VALUES (?, '[]', ?, 'running')",
                 (pid, time.time()))
    conn.close()


def test_a_new_worker_is_sampled_at_the_young_cadence(tmp_path: Path, parent: subprocess.Popen[str]) -> None:
    db = tmp_path / "run.db"
    run_file(db, parent.pid)
    sampler = WorkerSampler(str(db))
    wait = sampler.tick(parent.pid)
    assert sampler.samples == 1 and not sampler.lost
    assert wait <= workers.YOUNG_INTERVAL_S  # found just now: sampled again soon
    sampler._young_until = 0.0  # as if YOUNG_S had passed
    sampler._next = 0.0
    assert workers.YOUNG_INTERVAL_S < sampler.tick(parent.pid) <= workers.INTERVAL_S
    sampler.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM worker_samples").fetchone()[0] == 2
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 0


def test_samples_that_cannot_be_written_are_counted_and_said(tmp_path: Path, parent: subprocess.Popen[str]) -> None:
    db = tmp_path / "run.db"
    run_file(db, parent.pid)
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE worker_samples")  # every write now fails
    sampler = WorkerSampler(str(db))
    for _ in range(3):
        sampler._next = 0.0
        sampler.tick(parent.pid)
    assert sampler.samples == 0 and sum(sampler.lost.values()) == 3
    sampler.close()
    with sqlite3.connect(db) as conn:
        (kind, message, data), = conn.execute("SELECT kind, message, data FROM events").fetchall()
    assert kind == "recording_degraded"
    assert message.startswith("recording degraded: 3 DataLoader-worker sample(s) not written (OperationalError")
    assert json.loads(data)["lost"] == 3


def test_descendants_read_from_proc_children_are_psutils() -> None:
    """The supervisor lists the training's descendants from /proc/PID/task/TID/children (a few
    reads, not every process on the machine): the same pids as psutil's recursive walk, on a
    tree three deep, the child of a thread that is still running included (the kernel lists it
    under that thread, not the main one)."""
    import psutil

    hold = "lambda: (subprocess.Popen(['sleep', '30']), time.sleep(30))"
    tree = subprocess.Popen([sys.executable, "-c",
                             "import subprocess, threading, sys, time\n"
                             "subprocess.Popen(['bash', '-c', 'sleep 30 & sleep 30; wait'])\n"
                             f"t = threading.Thread(target={hold})\n"
                             "t.start()\n"
                             "print('ready', flush=True); time.sleep(30)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert tree.stdout is not None and tree.stdout.readline().strip() == "ready"
        expected = sorted(p.pid for p in psutil.Process(tree.pid).children(recursive=True))
        for _ in range(50):  # bash starts its second sleep a moment later
            if len(expected) >= 4:
                break
            time.sleep(0.05)
            expected = sorted(p.pid for p in psutil.Process(tree.pid).children(recursive=True))
        if not workers._CHILDREN_FILES:
            pytest.skip("this kernel has no /proc/PID/task/TID/children")
        assert len(expected) == 4 and sorted(workers._descendants(tree.pid) or []) == expected
    finally:
        for p in psutil.Process(tree.pid).children(recursive=True):
            p.kill()
        tree.kill()
        tree.wait()


def test_rss_reader_is_psutil_s_rss_and_follows_a_fork() -> None:
    """The step boundary's RSS reader (one open /proc descriptor) reads what psutil reads, and in
    a forked child reads the child, not the parent whose descriptor it inherited."""
    import os

    import psutil

    from memscope.agent.collectors.sampler import RssReader

    read = RssReader()
    page = os.sysconf("SC_PAGE_SIZE")
    assert abs(read() - psutil.Process().memory_info().rss) <= 64 * page
    assert abs(read.rss_vms()[1] - psutil.Process().memory_info().vms) <= 64 * page
    ballast = bytearray(256 << 20)  # the parent grows by 256 MiB after the reader opened
    ballast[:: page] = b"x" * len(range(0, len(ballast), page))
    parent = read()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child frees the ballast: its RSS falls, the parent's does not
        try:
            del ballast
            os.write(w, str((read(), psutil.Process().memory_info().rss)).encode())
        finally:
            os._exit(0)
    os.close(w)
    child, child_psutil = eval(os.read(r, 200).decode())
    os.waitpid(pid, 0)
    assert abs(child - child_psutil) <= 4 << 20  # the child touches pages between the two reads
    assert child < parent - (128 << 20)
    read.close()
    del ballast
