"""The dashboard draws the overview from a cheap head read first and loads the other views after
it; a live refresh reads only the rows appended since the last one (Pilot, real run files)."""

from __future__ import annotations

import shutil
import sqlite3
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from memscope.analysis.summary import summarize
from memscope.store.reader import RunReader
from memscope.store.writer import connect_rw
from memscope.units import human_bytes
from memscope_tui import app as app_module
from memscope_tui.app import VIEWS, MemscopeApp
from memscope_tui.data import Snapshot, load_snapshot

DATA = Path(__file__).parent / "data"
OTHER_VIEWS = [tab for tab, _ in VIEWS if tab != "overview"]


async def wait_until(pilot: Pilot[Any], predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the dashboard did not get there in time"
        await pilot.pause(0.02)


class Recording(MemscopeApp):
    """Remembers every snapshot it drew."""

    CSS_PATH = str(Path(app_module.__file__).with_name("app.tcss"))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.drawn: list[Snapshot] = []

    def _apply(self, snap: Snapshot) -> None:
        self.drawn.append(snap)
        super()._apply(snap)


def text_of(app: MemscopeApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


async def test_first_frame_shows_the_peak_before_the_other_views_load(tmp_path: Path) -> None:
    db = tmp_path / "leaky.db"
    shutil.copy(DATA / "leaky.sqlite", db)
    with RunReader(db) as reader:
        full = summarize(reader)
    app = MemscopeApp(str(db))
    app.hold_full = True  # the full read waits until released: a slow reader, deterministically
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.paints >= 1)
        await pilot.pause()
        assert app.snapshot is not None and app.snapshot.partial
        assert app.loads == 0 and app.full_reads == 0
        assert full.peak.bytes is not None
        assert text_of(app, "#peak") == f"peak {human_bytes(full.peak.bytes)} host RSS at step {full.peak.step}"
        assert f" {full.steps} steps · {full.samples} samples" in text_of(app, "#status")
        table = app.query_one("#steps", DataTable)
        assert table.row_count > 0 and str(table.get_row_at(0)[0]).strip() == str(app.snapshot.steps[0].step)
        for tab in OTHER_VIEWS:
            note = app.query_one(f"#loading-{tab}", Static)
            assert note.display and str(note.render()) == "loading…"
            assert not app.query_one(f"#view-{tab}").display
        app.release_full()
        await wait_until(pilot, lambda: app.loads >= 1)
        await pilot.pause()
        for tab in OTHER_VIEWS:
            assert not app.query_one(f"#loading-{tab}", Static).display
            assert app.query_one(f"#view-{tab}").display
        shown = app.snapshot
    # after loading, every view's data is what one full read gives
    expected = load_snapshot(str(db))
    assert shown is not None and not shown.partial
    assert replace(shown, read_s=0.0) == replace(expected, read_s=0.0)


def _make_live(db: Path) -> None:
    """The run says running and its writer is alive (a fresh heartbeat, no pid to look up)."""
    connect_rw(str(db)).close()  # today's schema, as a live agent's file has
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE run SET status = 'running', ended = NULL, exit_code = NULL, owner_pid = NULL")
    conn.execute("UPDATE processes SET status = 'finished', heartbeat = ?", (time.time(),))
    conn.close()


def _append(db: Path, samples: int, rss: int, peak: int) -> int:
    """The agent's next rows, in one transaction: host samples and one completed step."""
    conn = sqlite3.connect(db, isolation_level=None)
    proc, t = conn.execute("SELECT proc, max(t) FROM samples GROUP BY proc ORDER BY count(*) DESC").fetchone()
    step, end = conn.execute("SELECT max(step) + 1, max(end) FROM steps WHERE proc = ?", (proc,)).fetchone()
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO samples (proc, t, step, phase, rss) VALUES (?, ?, ?, 'backward', ?)",
                     [(proc, t + (i + 1) * 0.001, step, rss) for i in range(samples)])
    conn.execute("INSERT INTO steps (proc, step, start, end, peak_rss, status) VALUES (?, ?, ?, ?, ?, 'ok')",
                 (proc, step, end, t + samples * 0.001, peak))
    conn.execute("UPDATE processes SET heartbeat = ?", (time.time(),))
    conn.execute("COMMIT")
    conn.close()
    return int(step)


async def test_live_refresh_reads_only_the_new_rows(tmp_path: Path) -> None:
    db = tmp_path / "live.db"
    shutil.copy(DATA / "leaky.sqlite", db)
    _make_live(db)
    app = Recording(str(db), poll_s=0.1)
    app.full_every_s = 1e9  # full reads only for what changed (not also every 30 s)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.loads >= 1 and app.live)
        assert app.snapshot is not None and app.snapshot.summary.peak.bytes is not None
        before, peak = app.snapshot.summary.steps, app.snapshot.summary.peak.bytes
        fulls, drawn = app.full_reads, len(app.drawn)
        step = _append(db, 30, peak - 1, peak - 1)  # nothing the slow analyses read changes
        await wait_until(pilot, lambda: app.snapshot is not None and app.snapshot.summary.steps == before + 1)
        await pilot.pause()
        heads = [s.rows_read for s in app.drawn[drawn:] if s.rows_read]
        assert heads == [31]  # one refresh read the 30 samples and the step, nothing else
        assert app.full_reads == fulls  # the slow analyses' inputs did not change: not re-read
        assert str(app.query_one("#steps", DataTable).get_row_at(0)[0]).strip() == str(step)
        # a new peak shows at the next refresh (its breakdown comes with the next full read)
        step = _append(db, 5, peak - 1, peak + (64 << 20))
        await wait_until(pilot, lambda: text_of(app, "#peak").startswith(f"peak {human_bytes(peak + (64 << 20))} "))
        assert text_of(app, "#peak") == f"peak {human_bytes(peak + (64 << 20))} host RSS at step {step}"
        # ...which a new peak brings (spaced from the one before by FULL_MIN_S)
        await wait_until(pilot, lambda: app.full is not None and app.full.summary.peak.step == step)
        await pilot.pause()
        fulls = app.full_reads
        # a new inventory (what the leak analysis reads): the full read runs again
        conn = sqlite3.connect(db, isolation_level=None)
        cols = [r[1] for r in conn.execute("PRAGMA table_info(inventories)")]
        picked = ", ".join("step + 1" if c == "step" else c for c in cols)
        conn.execute(f"INSERT INTO inventories ({', '.join(cols)}) SELECT {picked}"
                     " FROM inventories ORDER BY step DESC LIMIT 1")
        conn.execute("UPDATE processes SET heartbeat = ?", (time.time(),))
        conn.close()
        await wait_until(pilot, lambda: app.full_reads > fulls)
