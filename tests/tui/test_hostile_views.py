"""Hostile data in every dashboard view (issue 22): run files carrying the corpus of
tests/hostile/corpus.py (a real script under attach, an edited real run file), opened in each
view with Pilot; a click on every table row and every line of text runs no action from the data (a
``[@click=app.screenshot(...)]`` name writes no file, ``[@click=quit]`` does not quit), nothing
crashes on ``[/]``, ``[pad]`` shows as written, and no cell or text holds a control character."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from textual.widgets import DataTable, Static

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))

import runs  # noqa: E402
from corpus import dangerous  # noqa: E402

from memscope_tui.app import VIEWS, MemscopeApp  # noqa: E402

SIZE = (100, 30)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hostile-tui")
    trap = base / "trap"
    trap.mkdir()
    victim = base / "victim.csv"
    victim.write_text("precious\n")
    return {"trap": trap, "edited": runs.edited(base, trap, victim), "attached": runs.attached(base, trap, steps=10)}


def _plain(renderable: Any) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def _shown(app: MemscopeApp) -> str:
    """Every cell of every table and every Static, as the text drawn."""
    out = []
    for table in app.query(DataTable):
        for i in range(table.row_count):
            out.extend(str(c) for c in table.get_row_at(i))
    for static in app.query(Static):
        out.append(_plain(static.content) if not isinstance(static.content, str) else static.content)
    return "\n".join(out)


def _click_meta(app: MemscopeApp) -> list[str]:
    """Actions attached to any drawn text (what a click would run): none may come from data."""
    console = Console(width=SIZE[0], color_system=None)
    found = []
    renderables: list[Any] = [static.content for static in app.query(Static)]
    renderables += [c for table in app.query(DataTable) for i in range(table.row_count)
                    for c in table.get_row_at(i)]
    for r in renderables:
        for seg in console.render(r):
            meta = seg.style.meta if seg.style is not None else {}
            found += [f"{k}={v}" for k, v in meta.items() if k.startswith("@")]
    return found


@pytest.mark.parametrize("which", ["edited", "attached"])
async def test_every_view_every_row_stays_inert(hostile: dict[str, Path], which: str) -> None:
    app = MemscopeApp(str(hostile[which]))
    actions: list[str] = []
    run_action = app.run_action

    async def recording(action: Any, *args: Any, **kwargs: Any) -> Any:
        actions.append(str(action))
        return await run_action(action, *args, **kwargs)

    app.run_action = recording  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        while app.loads < 1:
            await pilot.pause(0.05)
        for i, (tab, _) in enumerate(VIEWS, 1):
            await pilot.press(str(i))
            await pilot.pause()
            pane = app.query_one(f"#{tab}")
            for table in pane.query(DataTable):  # every row, at the cells that hold names
                for row in range(min(table.row_count, table.size.height - 1)):
                    await pilot.click(table, offset=(2, row + 1))  # the name column
                for _ in range(table.row_count):  # and every row under the cursor, by keyboard
                    table.action_cursor_down()
            for static in pane.query(Static):  # every line of the captions and texts
                for y in range(min(static.size.height, SIZE[1] - 4)):
                    await pilot.click(static, offset=(1, y))
            await pilot.pause()
            assert app.is_running, f"a click in {tab} closed the dashboard"
        shown = _shown(app)
        assert _click_meta(app) == []  # and no text anywhere carries a click action
        assert app.is_running
    assert list(hostile["trap"].iterdir()) == []  # the screenshot action never ran
    assert not any("screenshot" in a or "quit" in a or "bell" in a for a in actions), actions
    assert dangerous(shown) == []
    assert "[pad]" in shown and "[/]" in shown and "[@click=quit]quit" in shown  # shown as written
    assert "\\x1b]0;PWNED TITLE\\x07title" in shown
    if which == "edited":
        assert "ok\\nFAKE: memscope: error: nothing" in shown and "chars)" in shown
