"""Screenshots of the main screens at 80x24 (pytest-textual-snapshot), dark and light.

The run files are fixed: tests/tui/data/*.sqlite were written once by real example runs (see
tests/tui/data/README.md), so the screens are the same on every machine. A finished run shows
no clock-dependent text (its duration comes from the file; the read time shows only while live).
Update after an intended change: ``pytest tests/tui/test_snapshots.py --snapshot-update``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from textual.pilot import Pilot

from memscope_tui.app import HelpScreen, MemscopeApp

pytest.importorskip("pytest_textual_snapshot", reason="pip install pytest-textual-snapshot (dev group: make install)")

DATA = Path(__file__).parent / "data"
SIZE = (80, 24)


def loaded(theme: str | None = None) -> Callable[[Pilot[Any]], Any]:
    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, MemscopeApp)
        if theme is not None:
            app.theme = theme
        for _ in range(400):
            if app.loads >= 1:
                break
            await pilot.pause(0.05)
        assert app.loads >= 1, app.last_error
        await pilot.pause()
    return run_before


def frozen_clock() -> float:
    raise AssertionError("a finished run must not read the clock")


@pytest.mark.parametrize("key", ["1", "2", "3", "4"])
def test_views_of_a_leaking_run(snap_compare: Any, key: str) -> None:
    app = MemscopeApp(str(DATA / "leaky.sqlite"), now=frozen_clock)
    assert snap_compare(app, press=[key], terminal_size=SIZE, run_before=loaded())


@pytest.mark.parametrize("key", ["2", "3"])
def test_views_of_a_peft_run(snap_compare: Any, key: str) -> None:
    """peft-length module names at 80x24: Layers keeps saved and share, names cut in the middle,
    the highlighted row in full under the table; Leaks keeps its verdict and diff whole."""
    app = MemscopeApp(str(DATA / "peft.sqlite"), now=frozen_clock)
    assert snap_compare(app, press=[key], terminal_size=SIZE, run_before=loaded())


def test_leaks_view_light_theme(snap_compare: Any) -> None:
    app = MemscopeApp(str(DATA / "leaky.sqlite"), now=frozen_clock)
    assert snap_compare(app, press=["3"], terminal_size=SIZE, run_before=loaded("textual-light"))


def test_oom_view(snap_compare: Any) -> None:
    app = MemscopeApp(str(DATA / "oom.sqlite"), now=frozen_clock)
    assert snap_compare(app, press=["6"], terminal_size=SIZE, run_before=loaded())


def test_help(snap_compare: Any) -> None:
    app = MemscopeApp(str(DATA / "leaky.sqlite"), now=frozen_clock)
    before = loaded()

    async def help_open(pilot: Pilot[Any]) -> None:
        # open the modal here and wait until it is up and still: pressed as a snapshot key, it
        # was caught mid-transition once under a loaded machine
        await before(pilot)
        await pilot.press("question_mark")
        for _ in range(100):
            if isinstance(pilot.app.screen, HelpScreen):
                break
            await pilot.pause(0.02)
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.1)

    assert snap_compare(app, terminal_size=SIZE, run_before=help_open)
