"""The node file without processes: its size bounded by time (folding), its safe creation, the
exporter's address rule and the command lines it stores (secrets taken out)."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from memscope.node import nodefold
from memscope.node.growth import trend
from memscope.node.nodefile import NodeWriter
from memscope.node.nodereader import NodeReader
from memscope.store.schema import RunFileError

DAY = 86400.0
EVERY = 10.0  # a sample every 10 s
DAYS = 5


def _fill(db: Path) -> tuple[sqlite3.Connection, float, dict[int, list[int]]]:
    """Five days of samples of two processes, stored as the daemon stores them (one row each):
    proc 1 grows 100 MiB an hour (28 KiB/s, above the floor) under noise, proc 2 is flat under
    the same noise; a third ended 40 days ago."""
    writer = NodeWriter(str(db), {"interval": EVERY, "window": 600.0})
    writer.close()
    conn = sqlite3.connect(db, isolation_level=None)
    end = 100 * DAY
    start = end - DAYS * DAY
    levels: dict[int, list[int]] = {1: [], 2: []}
    rows = []
    for proc in (1, 2, 3):
        conn.execute("INSERT INTO processes (id, pid, started, command, first_seen, last_seen, ended)"
                     " VALUES (?, ?, 0, '[]', ?, ?, ?)", (proc, 100 + proc, start, end,
                                                          end - 40 * DAY if proc == 3 else None))
    n = int(DAYS * DAY / EVERY)
    for i in range(n):
        t = start + i * EVERY
        noise = (i * 7919) % 4096 * 1024  # up to 4 MiB, deterministic
        for proc, base in ((1, (1 << 30) + int((t - start) / 3600 * (100 << 20))), (2, 1 << 30)):
            level = base + noise
            levels[proc].append(level)
            rows.append((proc, t, t, 1, level, level, None, None))
    rows += [(3, end - 41 * DAY + i, end - 41 * DAY + i, 1, 5, 5, None, None) for i in range(100)]
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO samples (proc, t, t_end, n, rss_min, rss_max, gpu_min, gpu_max)"
                     " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.execute("COMMIT")
    return conn, end, levels


def test_old_samples_fold_into_windows_keeping_peaks_lows_and_counts(tmp_path: Path) -> None:
    db = tmp_path / "node.db"
    conn, end, levels = _fill(db)
    before = conn.execute("SELECT count(*) FROM samples").fetchone()[0]
    assert before == 2 * DAYS * DAY / EVERY + 100
    gone = nodefold.fold(conn, end)
    per = dict(conn.execute("SELECT proc, count(*) FROM samples GROUP BY proc").fetchall())
    # the last hour whole (360), a row a minute up to two days (47 h: 2820), an hour a row beyond (72)
    assert per == {1: 360 + 2820 + 72, 2: 360 + 2820 + 72}, per
    assert gone == before - sum(per.values())
    assert nodefold.fold(conn, end) == 0  # nothing more is due
    for proc in (1, 2):
        lo, hi, count = conn.execute("SELECT min(rss_min), max(rss_max), sum(n) FROM samples WHERE proc = ?",
                                     (proc,)).fetchone()
        assert (lo, hi, count) == (min(levels[proc]), max(levels[proc]), len(levels[proc]))
    widths = [w for (w,) in conn.execute("SELECT t_end - t FROM samples WHERE proc = 1")]
    assert max(widths) < 3600
    # a process gone for longer than KEEP_ENDED_S keeps its row, not its samples
    assert conn.execute("SELECT count(*) FROM samples WHERE proc = 3").fetchone()[0] == 0
    assert conn.execute("SELECT pid FROM processes WHERE id = 3").fetchone() == (103,)
    conn.close()
    with NodeReader(db) as reader:  # the growth rule over the folded history: the riser only
        for proc, grows in ((1, True), (2, False)):
            points = [(s["t_end"], s["rss_min"]) for s in reader.samples(proc)]
            found = trend(points)
            assert found.growing is grows, (proc, found)
        rate = trend([(s["t_end"], s["rss_min"]) for s in reader.samples(1)]).bytes_per_s
        assert abs(rate - (100 << 20) / 3600) < 0.05 * (100 << 20) / 3600


def test_created_exclusively_and_never_through_a_link(tmp_path: Path) -> None:
    db = tmp_path / "node.db"
    old = os.umask(0)
    try:
        NodeWriter(str(db), {}).close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert not list(tmp_path.glob("node.db-*"))  # closed: the -wal folded in
    link = tmp_path / "link.db"
    link.symlink_to(db)
    with pytest.raises(RunFileError, match="is a symbolic link"):
        NodeWriter(str(link), {})
    dangling = tmp_path / "dangling.db"
    dangling.symlink_to(tmp_path / "elsewhere.db")
    with pytest.raises(RunFileError, match="is a symbolic link"):
        NodeWriter(str(dangling), {})
    assert not (tmp_path / "elsewhere.db").exists()
    (tmp_path / "left.db-wal").write_bytes(b"x")
    with pytest.raises(RunFileError, match="left from an earlier file"):
        NodeWriter(str(tmp_path / "left.db"), {})
    run = tmp_path / "run.db"
    from memscope.store.runs import create_run

    create_run(str(run), ["python", "train.py"])
    with pytest.raises(RunFileError, match="not a memscope node file"):
        NodeWriter(str(run), {})  # a run file is not continued as a node file


def test_prometheus_address_defaults_to_loopback() -> None:
    from memscope.node.exporter import parse_address

    assert parse_address("9464") == ("127.0.0.1", 9464)
    assert parse_address(":9464") == ("127.0.0.1", 9464)
    assert parse_address("0.0.0.0:9464") == ("0.0.0.0", 9464)
    assert parse_address("[::1]:0") == ("::1", 0)
    for bad in ("host:http", "70000", "x"):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_stored_commands_keep_no_secret(tmp_path: Path) -> None:
    from memscope.node.commands import shown_argv

    argv = ["python", "train.py", "--api-key", "sk-123", "--wandb_token=abc", "--data",
            "https://user:pw@host/x", "--lr", "3e-4"]
    assert shown_argv(argv) == ["python", "train.py", "--api-key", "***", "--wandb_token=***", "--data",
                                "https://***@host/x", "--lr", "3e-4"]
    text = json.dumps(shown_argv(argv))
    assert "sk-123" not in text and "abc" not in text and "pw" not in text
