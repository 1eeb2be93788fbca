"""The dashboard's overview (view 1) and its reading loop, driven with Textual's Pilot on real
run files."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from memscope.analysis.timeline import memory_timeline
from memscope.units import human_bytes
from memscope.store.reader import RunReader
from memscope.store.runs import create_run, finish_run
from memscope_tui.app import HelpScreen, MemscopeApp, StepRuler
from memscope_tui.plot import Plot

ROOT = Path(__file__).resolve().parents[2]


async def wait_until(pilot: Pilot[Any], predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the dashboard did not get there in time"
        await pilot.pause(0.05)


def text_of(app: MemscopeApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


async def test_header_shows_the_run(tiny_run: Path, tiny_report: dict[str, Any]) -> None:
    run = tiny_report["run"]
    app = MemscopeApp(str(tiny_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.loads >= 1)
        await pilot.pause()
        command, status, device, peak = (text_of(app, "#command"), text_of(app, "#status"),
                                         text_of(app, "#device"), text_of(app, "#peak"))
    assert "tiny_gpt.py --steps 8" in command
    assert status.startswith("finished (exit 0)")
    assert f" {run['steps']} steps" in status
    assert f" {run['samples']} samples" in status and " 0 dropped" in status
    assert device.startswith(f"{run['device']} · torch {run['torch']}")
    assert "steps by optimizer" in device
    assert peak.startswith(f"peak {human_bytes(tiny_report['peak']['bytes'])} host RSS")


async def test_steps_table_lists_the_last_steps(tiny_run: Path, tiny_report: dict[str, Any]) -> None:
    steps = tiny_report["run"]["steps"]
    app = MemscopeApp(str(tiny_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.loads >= 1)
        table = app.query_one("#steps", DataTable)
        assert table.row_count == min(steps, 50)
        labels = [str(c.label) for c in table.columns.values()]
        first = [str(cell) for cell in table.get_row_at(0)]
        last = [str(cell) for cell in table.get_row_at(table.row_count - 1)]
    assert labels == ["step", "duration", "peak RSS", "status"]  # CPU run: no CUDA columns
    assert first[0] == str(steps - 1) and last[0] == "0"  # most recent first
    assert first[1].endswith(" ms") and first[3] == "ok"
    with RunReader(tiny_run) as reader:
        peak_rss = reader.steps(1)[-1]["peak_rss"]
    assert first[2] == human_bytes(peak_rss)


async def test_timeline_shows_host_rss(tiny_run: Path) -> None:
    with RunReader(tiny_run) as reader:
        tl = memory_timeline(reader)
    rss = tl.series["rss"]
    app = MemscopeApp(str(tiny_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.loads >= 1)
        await pilot.pause()
        caption = text_of(app, "#caption")
        plot = app.query_one("#timeline", Plot)
        lines = str(plot.render()).splitlines()
        ruler = app.query_one("#ruler", StepRuler)
        ruler_text = str(ruler.render())
        region = plot.region
    assert caption.startswith("host RSS")
    assert f"high {human_bytes(rss.max)}" in caption and f"low {human_bytes(rss.min)}" in caption
    assert region.width >= 70 and region.height >= 8  # readable at 80x24
    assert "host RSS" in lines[0] and "tensors" in lines[0]  # the legend: two series
    assert lines[-3].strip().endswith("0 B ┤") or "0 B ┤" in lines[-3]  # from zero
    assert any("MiB ┤" in line for line in lines[1:-2])  # memory-unit labels
    assert lines[-1].strip().endswith(" s") and "└" in lines[-2]  # a time axis
    assert ruler_text.lstrip().startswith("steps") and ruler_text.count("╵") >= 1  # step ends marked


async def test_q_quits(tiny_run: Path) -> None:
    app = MemscopeApp(str(tiny_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.loads >= 1)
        await pilot.press("q")
        await wait_until(pilot, lambda: not app.is_running, timeout=5)
    assert app.return_code == 0


async def test_question_mark_shows_help(tiny_run: Path) -> None:
    app = MemscopeApp(str(tiny_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.loads >= 1)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        body = str(app.screen.query_one("#help-body", Static).render())
        assert "q        quit" in body and "r        refresh" in body
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        assert app.is_running


async def test_finished_run_is_read_once_and_on_request(tiny_run: Path) -> None:
    app = MemscopeApp(str(tiny_run), poll_s=0.1)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.loads >= 1)
        await pilot.pause(0.5)
        assert app.loads == 1 and not app.live  # finished: no polling
        await pilot.press("r")
        await wait_until(pilot, lambda: app.loads >= 2)
        await pilot.press("m")  # a CPU run has one metric: says so, nothing breaks
        await pilot.pause()
        assert app.is_running and text_of(app, "#caption").startswith("host RSS")


async def test_follows_a_live_run_until_it_ends(tmp_path: Path) -> None:
    db = tmp_path / "live.db"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(db),
                             "tests/scripts/loop.py", "--steps", "2000", "--sleep", "0.05"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (db.exists() and _steps(db) >= 2):
            assert time.monotonic() < deadline and proc.poll() is None, "the run did not start"
            time.sleep(0.1)
        # attached, as under `memscope attach`: the status line's longest form
        app = MemscopeApp(str(db), poll_s=0.2, attached=True)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: app.loads >= 1)
            assert app.live and text_of(app, "#status").startswith("live · ")
            # at 80 columns the live status line is whole: the read time and both keys, no "…"
            drawn = app.screen._compositor.render_strips()[app.query_one("#state").region.y].text.rstrip()
            assert re.fullmatch(r" live · read \d+ ms/0.2 s · q: close, training goes on · ctrl\+c: interrupt",
                                drawn), drawn
            assert "now step " in text_of(app, "#device")  # the step being sampled now
            first = app.snapshot
            assert first is not None
            await wait_until(pilot, lambda: app.snapshot is not None
                             and app.snapshot.summary.steps >= first.summary.steps + 3)
            assert app.loads >= 2
            table = app.query_one("#steps", DataTable)
            assert str(table.get_row_at(0)[0]) == str(app.snapshot.steps[0].step)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            await wait_until(pilot, lambda: not app.live)
            # the run's end (seen by the head read) brings one last full read of the ended run
            await wait_until(pilot, lambda: app.full is not None and app.full.summary.status != "running")
            loads = app.loads
            assert text_of(app, "#status").startswith("killed (signal 15)")
            await pilot.pause(0.6)
            assert app.loads == loads  # polling stopped with the run
    finally:
        proc.kill()
        proc.wait()


def _steps(db: Path) -> int:
    try:
        with RunReader(db) as reader:
            return len(reader.steps())
    except Exception:
        return 0


async def test_run_file_just_created(tmp_path: Path) -> None:
    # the state right after `memscope attach` created the file: a run row, nothing else yet
    db = tmp_path / "fresh.db"
    create_run(str(db), ["python", "train.py"])
    app = MemscopeApp(str(db), poll_s=0.1)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.loads >= 2)  # running: it keeps polling
        assert app.live
        assert text_of(app, "#status").startswith("live · ")
        assert " 0 steps · 0 samples" in text_of(app, "#status")
        assert text_of(app, "#caption") == "no memory samples yet"
        assert app.query_one("#steps", DataTable).row_count == 0


async def test_finished_run_without_samples_is_not_waiting(tmp_path: Path) -> None:
    db = tmp_path / "done.db"
    create_run(str(db), ["python", "train.py"])
    finish_run(str(db), exit_code=1, signal=None, status="failed")  # died before its first sample
    app = MemscopeApp(str(db), poll_s=0.1)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.loads >= 1)
        assert not app.live
        assert text_of(app, "#caption") == "no memory samples in this run"


async def test_unreadable_file_is_reported_not_fatal(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    app = MemscopeApp(str(db), poll_s=0.1)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await wait_until(pilot, lambda: app.last_error is not None)
        assert "not a memscope run file" in app.last_error
        assert app.is_running and app.loads == 0
        assert text_of(app, "#caption") == "reading run file…"


async def test_abandoned_run_is_not_polled(tmp_path: Path) -> None:
    # a run whose supervisor died without ending it (SIGKILL): the file says running, no
    # writer is left; the dashboard says abandoned, shows the live drop count, stops reading
    db = tmp_path / "abandoned.db"
    create_run(str(db), ["python", "train.py"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE run SET owner_pid = ?", (gone.pid,))
        conn.execute("INSERT INTO processes (pid, started, status, dropped, heartbeat)"
                     " VALUES (?, 0, 'running', 12, 0)", (gone.pid,))
    app = MemscopeApp(str(db), poll_s=0.1)
    async with app.run_test(size=(100, 24)) as pilot:
        await wait_until(pilot, lambda: app.loads >= 1)
        await pilot.pause(0.5)
        assert app.loads == 1 and not app.live  # read once, then no polling
        assert text_of(app, "#status").startswith("abandoned · no writer left")
        assert "12 dropped" in text_of(app, "#status")
        assert "not refreshing" in text_of(app, "#state")
