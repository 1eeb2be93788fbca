"""The dashboard at 80x24 (and wide) with peft-length module names (issue 23, part 6), read from
the screen as drawn: a real LoRA-shaped model (tests/scripts/peft_names.py) run under
``memscope attach``, opened with Pilot. The saved column and every row's figure are on screen,
no figure is cut (by the table's edge, an ellipsis or a line wrap), a shortened name keeps both
ends and the highlighted row's full name is in the line under the table; every key that works is
in ``?`` help."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import DataTable, Static

from memscope.units import human_bytes
from memscope_tui.app import VIEWS, HelpScreen, MemscopeApp

SMALL, WIDE = (80, 24), (160, 40)
# a whole figure as the dashboard draws one: 480K, 66.0K, 0B, 15%, 26.54 MiB, +96.00 KiB, 4.9,
# 12 ms, 1→9, - (no value)
FIGURE = re.compile(r"[+-~]?\d+(\.\d+)?( ?([KMGTP]i?B|[KMGTP]|B|ms|s|%))?|\d+→\d+|-")
UNIT_START = re.compile(r"(KiB|MiB|GiB|TiB|PiB|B|ms|s)\b")
BARS = set(" ▏▎▍▌▋▊▉█")


def screen(app: MemscopeApp) -> list[str]:
    """The terminal's lines as drawn (what a person sees), through the screen's compositor."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def cells(line: str) -> list[str]:
    """A table line's cells: DataTable puts two or more spaces between columns."""
    return [c for c in re.split(r"\s{2,}", line.strip()) if c]


async def loaded(pilot: Pilot[Any], app: MemscopeApp, key: str) -> None:
    for _ in range(400):
        if app.loads >= 1:
            break
        await pilot.pause(0.05)
    assert app.loads >= 1, app.last_error
    await pilot.press(key)
    await settled(pilot, app)


async def settled(pilot: Pilot[Any], app: MemscopeApp) -> None:
    """Until the screen draws the same twice in a row (a loaded machine renders late; a fixed
    pause made these tests flaky)."""
    last: list[str] | None = None
    for _ in range(100):
        await pilot.pause(0.05)
        now = screen(app)
        if now == last:
            return
        last = now


def table_lines(app: MemscopeApp, table: DataTable[Any]) -> tuple[str, list[str]]:
    """The table's header line and its visible row lines, cut out of the screen (without the
    scrollbar)."""
    lines = screen(app)
    region = table.scrollable_content_region
    top, left, width = region.y, region.x, region.width
    rows = [line[left:left + width] for line in lines[top:top + table.region.height]]
    return rows[0], rows[1:1 + min(table.row_count, table.region.height - 1)]


def assert_rows_whole(app: MemscopeApp, table: DataTable[Any]) -> tuple[str, list[str]]:
    """Every shown column's label and every visible cell are on screen whole; figures are whole."""
    header, rows = table_lines(app, table)
    labels = [str(c.label) for c in table.columns.values()]
    assert cells(header) == [label for label in labels if label], header
    for i, line in enumerate(rows):
        drawn = [c.plain.strip() if hasattr(c, "plain") else str(c) for c in table.get_row_at(i)]
        for cell in drawn:
            assert cell.strip(" ▏▎▍▌▋▊▉█") in line, (cell, line)
        for cell in cells(line):
            if cell[0].isdigit() or cell[0] in "+-~" or set(cell) <= BARS:
                assert FIGURE.fullmatch(cell) or set(cell) <= BARS, (cell, line)
    return header, rows


def assert_no_figure_wrapped(lines: list[str]) -> None:
    """No line ends in a number whose unit starts the next line (82.50 / KiB), and no line was
    cut with an ellipsis at its end."""
    for above, below in zip(lines, lines[1:]):
        if re.search(r"\d$", above.rstrip(" ▁▂▃▄▅▆▇█▔▎▊▏")):
            text = below.strip(" │")
            assert not UNIT_START.match(text), (above, below)
    for line in lines:
        assert not line.rstrip(" ▁▂▃▄▅▆▇█▔▎▊▏│").endswith("…"), line


@pytest.mark.parametrize("size", [SMALL, WIDE])
async def test_layers_keep_saved_and_shorten_names_from_the_middle(peft_run: Path,
                                                                   size: tuple[int, int]) -> None:
    app = MemscopeApp(str(peft_run))
    async with app.run_test(size=size) as pilot:
        await loaded(pilot, app, "2")
        table = app.query_one("#layer-table", DataTable)
        snap = app.snapshot
        assert snap is not None and table.row_count > 10
        header, rows = assert_rows_whole(app, table)
        assert cells(header)[:4] == ["module", "type", "saved", "share"]
        by_name = {("(model)" if h.module == "" else h.module): h for h in snap.layers}
        order = [str(table.coordinate_to_cell_key((i, 0)).row_key.value) for i in range(len(rows))]
        shortened = []
        for module, line in zip(order, rows):
            h = next(x for x in snap.layers if x.module == module)
            name, *rest = cells(line)
            # the saved figure of this very module, whole, in the third column
            saved = rest[1] if h.type else rest[0]
            assert saved == human_bytes(h.activation_bytes), line
            full = "(model)" if module == "" else module
            if "…" in name:
                head, tail = name.split("…")
                assert full.startswith(head) and full.endswith(tail) and len(head) >= 3 and len(tail) >= 8, name
                shortened.append((len(shortened), module))
            else:
                assert name == full or (module == "" and name == "(model)")
        assert len(by_name) == table.row_count
        if size == SMALL:
            assert shortened, "the peft names fit at 80 columns: the test proves nothing"
            # the highlighted row in full under the table: move onto a shortened one
            target = next(i for i, m in enumerate(order) if "…" in cells(rows[i])[0])
            for _ in range(target):
                await pilot.press("down")
            await pilot.pause(0.1)
            full = order[target]
            detail = app.query_one("#layer-detail", Static)
            drawn = screen(app)[detail.region.y:detail.region.bottom]
            assert any(full in line for line in drawn), (full, drawn)
            h = next(x for x in snap.layers if x.module == full)
            # and every figure of the row, the columns left out at 80 included
            assert f"saved {human_bytes(h.activation_bytes)}" in " ".join(drawn)
            assert f"fwd {h.forward_s * 1000:.1f} ms" in " ".join(drawn)
            # the bars come before the times: the view is a bar chart of the saved bytes
            assert "calls" not in cells(header) and "fwd ms" not in cells(header)
            assert any(ch in rows[0] for ch in "█▉▊▋▌▍▎▏"), rows[0]
        else:
            assert not shortened and "calls" in cells(header)  # 160 columns: everything, in full
        assert_no_figure_wrapped(screen(app))


@pytest.mark.parametrize("size", [SMALL, WIDE])
async def test_every_view_fits(peft_run: Path, peft_oom_run: Path, size: tuple[int, int]) -> None:
    """Each view, on the leaking and the out-of-memory run: tables whole, no figure split from
    its unit by a wrap, no line cut with an ellipsis (status line, captions, verdicts)."""
    for db in (peft_run, peft_oom_run):
        app = MemscopeApp(str(db))
        async with app.run_test(size=size) as pilot:
            await loaded(pilot, app, "1")
            for key in "1234567":
                await pilot.press(key)
                await settled(pilot, app)
                for table in app.screen.query(DataTable):
                    if table.region.width and table.row_count:
                        assert_rows_whole(app, table)
                assert_no_figure_wrapped(screen(app))


async def test_leaks_header_and_diff_at_80x24(peft_run: Path) -> None:
    app = MemscopeApp(str(peft_run))
    async with app.run_test(size=SMALL) as pilot:
        await loaded(pilot, app, "3")
        snap = app.snapshot
        assert snap is not None and snap.summary.leaks
        verdicts = app.query_one("#verdicts", Static)
        drawn = " ".join(line.strip() for line in screen(app)[verdicts.region.y:verdicts.region.bottom])
        leak = snap.summary.leaks[0]
        # the whole verdict line is on screen, the holder and the storing line at its end included
        assert "held by __main__.kept" in drawn and f"peft_names.py:{leak.site.rsplit(':', 1)[1]}" in drawn
        caption = app.query_one("#diff-caption", Static)
        text = " ".join(line.strip() for line in screen(app)[caption.region.y:caption.region.bottom])
        assert f"inventories at {', '.join(str(s) for s in snap.inventory_steps)}" in text
        table = app.query_one("#diff", DataTable)
        header, rows = assert_rows_whole(app, table)
        assert {"tensors", "Δ bytes"} <= set(cells(header)) and rows


def _bindings(node: Any) -> list[tuple[str, str]]:
    return [(key, node.app.get_key_display(b)) for key, bs in node._bindings.key_to_bindings.items()
            for b in bs]


def _can_have_focus(widget: Widget) -> bool:
    """A widget's bindings work only while it or a widget inside it has the focus."""
    return any(w.can_focus for w in (widget, *widget.walk_children(Widget)))


@pytest.mark.parametrize("attached", [False, True])
async def test_every_key_is_in_help(peft_run: Path, attached: bool) -> None:
    """Every binding of the app, of each screen and of each widget that can take the focus (the
    views, their tables and texts, the tab bar, the filter box, the help's own scroller) is
    written in ? help, as the footer writes it (^c, ←, pgdn) or by its name; under
    ``memscope attach`` (q and ctrl+c then mean other things) too."""
    app = MemscopeApp(str(peft_run), attached=attached)
    async with app.run_test(size=SMALL) as pilot:
        await loaded(pilot, app, "2")
        keys = _bindings(app) + _bindings(app.screen)
        owners = {"app", "screen"}
        for widget in app.screen.walk_children(Widget):
            if _can_have_focus(widget) and _bindings(widget):
                keys += _bindings(widget)
                owners.add(type(widget).__name__)
        await pilot.press("question_mark")
        await settled(pilot, app)
        assert isinstance(app.screen, HelpScreen)
        keys += _bindings(app.screen)
        keys += [k for w in app.screen.walk_children(Widget) if _can_have_focus(w) for k in _bindings(w)]
        body = app.screen.query_one("#help-body", Static)
        text = str(body.render())
        # the help is not wrapped at 80 columns: one screen line per line written
        assert body.size.height == text.count("\n") + 1
    tokens = set(re.split(r"[\s,()]+", text))
    # the views' own keys come from their hints; the help lists those too
    assert {"LayersView", "LeaksView", "BreakdownView", "RowTable", "Input", "ContentTabs"} <= owners
    missing = sorted({(key, shown) for key, shown in keys
                      if shown not in tokens and key not in tokens
                      and not (key.isdigit() and "1-7" in tokens)})
    assert not missing, f"keys that work but are not in ? help: {missing}"
    assert len({k for k, _ in keys}) > 40  # the enumeration found the widgets' keys, not just the app's
    assert re.search(r"^← →\s+scroll sideways", text, re.M)  # → scrolls a wide table (the case)
    assert {view.TITLE for _, view in VIEWS} <= tokens


async def test_hostile_names_at_80x24(tmp_path: Path) -> None:
    """The hostile corpus (markup, escapes, wide characters, 10,000-character names) as module
    names and types at 80x24: the saved column stays, every figure whole."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
    import runs

    trap = tmp_path / "trap"
    trap.mkdir()
    victim = tmp_path / "victim.csv"
    victim.write_text("precious\n")
    db = runs.edited(tmp_path, trap, victim)
    con = sqlite3.connect(db)
    with con:  # and a name of wide characters (two cells each) at the top of the table
        step, proc = con.execute("SELECT max(step), min(proc) FROM layer_stats").fetchone()
        con.execute("INSERT INTO layer_stats (proc, step, module, type, calls, saved_bytes, saved_tensors, "
                    "output_bytes, forward_s) VALUES (?, ?, ?, ?, 1, ?, 1, 1, 0.001)",
                    (proc, step, "模型." * 12 + "注意力", "注意力层", 2 * 10**9))
    con.close()
    app = MemscopeApp(str(db))
    async with app.run_test(size=SMALL) as pilot:
        await loaded(pilot, app, "2")
        table = app.query_one("#layer-table", DataTable)
        header, rows = assert_rows_whole(app, table)
        assert cells(header)[:4] == ["module", "type", "saved", "share"] and len(rows) > 5


async def test_more_leaks_than_fit_are_counted(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Eight leaks (tests/scripts/leak_holders.py) at 80x24: the verdicts show whole leak lines
    and then how many more there are, within their five lines; nothing is cut. The run is
    tests/test_leak_holders.py's, made once per session (tests/shared_runs.py)."""
    from conftest import _shared

    db = _shared(tmp_path_factory, "tests/scripts/leak_holders.py", "12")
    app = MemscopeApp(str(db))
    async with app.run_test(size=SMALL) as pilot:
        await loaded(pilot, app, "3")
        snap = app.snapshot
        assert snap is not None and len(snap.summary.leaks) >= 6
        verdicts = app.query_one("#verdicts", Static)
        drawn = screen(app)[verdicts.region.y:verdicts.region.bottom]
        assert 3 <= len(drawn) <= 5
        text = " ".join(line.strip() for line in drawn)
        shown = text.count("LEAK ")
        assert 1 <= shown < len(snap.summary.leaks)
        more = len(snap.summary.leaks) - shown
        assert text.endswith(f"+{more} more leaks: memscope leaks {db} lists all"), text  # this very file
        for lk in snap.summary.leaks[:shown]:  # each shown leak whole, its storing line at the end
            assert lk.site is not None and lk.site in text, lk.site
        assert_no_figure_wrapped(screen(app))
