"""Keys that do what ``?`` says (Pilot, real run files): home and end go to a table's first and last
row; ctrl+c quits with exit status 130 (the dashboard, the top view), and under ``memscope attach``
interrupts the training instead of quitting."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import DataTable

from memscope_tui.app import MemscopeApp

DATA = Path(__file__).parent / "data"


async def wait_until(pilot: Pilot[Any], predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the dashboard did not get there in time"
        await pilot.pause(0.02)


async def test_home_and_end_go_to_the_first_and_last_row() -> None:
    """The leaky run's steps table (its last 50 steps: more than 80x24 shows) and the layers
    table: end puts the cursor on the last row, scrolled into view, home back on the first;
    the columns do not move sideways."""
    app = MemscopeApp(str(DATA / "leaky.sqlite"))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.loads >= 1)
        for key, table_id in (("1", "#steps"), ("2", "#layer-table")):
            await pilot.press(key)
            await pilot.pause()
            table = app.query_one(table_id, DataTable)
            await wait_until(pilot, lambda t=table: t.row_count > 2)
            table.focus()
            await pilot.pause()
            rows = table.row_count
            assert table.cursor_row == 0
            await pilot.press("end")
            await pilot.pause()
            assert table.cursor_row == rows - 1, table_id
            assert table.scroll_x == 0
            if table_id == "#steps":  # more rows than it shows: the last one scrolled into view
                assert rows > table.size.height and table.scroll_y > 0
            await pilot.press("home")
            await pilot.pause()
            assert (table.cursor_row, table.scroll_y, table.scroll_x) == (0, 0, 0), table_id


async def press_on_loaded(key: str, attached: bool = False) -> MemscopeApp:
    """The dashboard on the leaky run, ``key`` pressed once it has loaded; the app after."""
    app = MemscopeApp(str(DATA / "leaky.sqlite"), attached=attached)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.loads >= 1)
        await pilot.press(key)
        await pilot.pause()
        app.running_after = app.is_running  # type: ignore[attr-defined]
    return app


async def test_ctrl_c_quits_with_130_and_interrupts_the_training_when_attached() -> None:
    assert (await press_on_loaded("ctrl+c")).return_code == 130
    assert (await press_on_loaded("q")).return_code == 0
    attached = await press_on_loaded("ctrl+c", attached=True)  # the run has ended: it says so, stays open
    assert attached.running_after and attached.return_code is None  # type: ignore[attr-defined]


async def test_ctrl_c_quits_the_top_view_with_130() -> None:
    from memscope_tui.top import LiveSource, TopApp

    app = TopApp(LiveSource(10.0), interval=5.0)
    async with app.run_test(size=(100, 24)) as pilot:
        await wait_until(pilot, lambda: app.samples >= 1)
        await pilot.press("ctrl+c")
        await pilot.pause()
    assert app.return_code == 130
