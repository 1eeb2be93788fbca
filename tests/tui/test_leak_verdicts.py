"""The Leaks view says when it has not looked enough for a verdict (and what to do), and shows
growth no tensor group explains: real short runs, driven with Textual's Pilot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from conftest import EXAMPLES, _attach, _shared
from memscope.analysis.summary import summarize
from memscope.store.reader import RunReader
from memscope_tui.app import MemscopeApp


async def verdicts(db: Path) -> str:
    app = MemscopeApp(str(db))
    async with app.run_test(size=(120, 24)) as pilot:
        await _loaded(pilot, app)
        await pilot.press("3")
        await pilot.pause()
        return str(app.query_one("#verdicts", Static).render())


async def _loaded(pilot: Pilot[Any], app: MemscopeApp) -> None:
    for _ in range(400):
        if app.loads >= 1:
            return
        await pilot.pause(0.05)
    raise AssertionError("the dashboard did not load the run")


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 steps of detached_list: made once per session (tests/shared_runs.py), tests/test_leaks.py
    reads it too."""
    return _shared(tmp_path_factory, "examples/leaks/detached_list.py", "--steps", "4")


@pytest.fixture(scope="module")
def growing_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("leakview") / "growing.db"
    # 40 steps: at 20 a heap jump and two flat steps in one quarter once failed the steadiness
    # rule under the suite's load
    _attach(db, str(EXAMPLES / "leaks" / "numpy_history.py"), "--steps", "40")
    return db


async def test_too_few_inventories_is_not_none(short_run: Path) -> None:
    with RunReader(short_run) as reader:
        check = summarize(reader).leak_check
    assert check.verdict == "insufficient"
    text = await verdicts(short_run)
    assert "no leaks" not in text
    assert "not enough inventories to tell yet" in text and check.advice() in text.replace("\n", " ")


async def test_growth_nothing_explains_shows(growing_run: Path) -> None:
    with RunReader(growing_run) as reader:
        s = summarize(reader)
    assert s.unexplained is not None and not s.leaks
    text = await verdicts(growing_run)
    assert f"no leaks in {s.leak_check.inventories} inventories" in text
    # the panel wraps at its width: where depends on the rate's digits (266.23 wrapped in CI)
    flat = " ".join(text.split())
    assert "GROWTH" in flat and "no tensor group explains" in flat
