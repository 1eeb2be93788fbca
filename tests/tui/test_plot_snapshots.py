"""The dashboard's plots at 80x24 and 160x48, on a leaking and a healthy run: what is drawn
(axes in memory units from 0 B, the time or step axis, the legend, the leak's line and the
verdict's rate) checked in the plot's own text, and the whole screen as a snapshot.

The run files are fixed (tests/tui/data/README.md), so the screens are the same on every
machine. Update after an intended change: ``pytest tests/tui/test_plot_snapshots.py
--snapshot-update``, then look at the SVGs."""

from __future__ import annotations

import re
from typing import Any

import pytest
from rich.text import Text

from memscope.analysis.run_timeline import run_timeline
from memscope.analysis.summary import summarize
from memscope.store.reader import RunReader
from memscope.units import human_bytes
from memscope_tui.app import MemscopeApp
from memscope_tui.plot import Plot
from test_snapshots import DATA, frozen_clock, loaded

pytest.importorskip("pytest_textual_snapshot", reason="pip install pytest-textual-snapshot (dev group: make install)")

SIZES = [(80, 24), (160, 48)]
Y_LABEL = re.compile(r"^ *\d+(\.\d+)? (B|KiB|MiB|GiB) ┤")


def plot_lines(app: MemscopeApp, selector: str) -> tuple[list[Text], Any]:
    plot = app.query_one(selector, Plot)
    text = plot.render()
    return text.split("\n"), plot.region


def assert_axes(lines: list[Text], x_unit: str, height: int) -> None:
    """A legend line, plot rows with memory-unit labels ending at 0 B, an axis line and its labels."""
    plain = [t.plain for t in lines]
    assert len(plain) == height, plain
    labelled = [p for p in plain[1:-2] if Y_LABEL.match(p)]
    assert len(labelled) >= 3 and labelled[-1].lstrip().startswith("0 B ┤"), plain
    assert "└" in plain[-2] and "┬" in plain[-2]
    if x_unit == "s":
        assert re.search(r"\d s\b", plain[-1]), plain[-1]
    else:
        assert plain[-1].lstrip().startswith("step") and re.search(r"\b\d+\b", plain[-1]), plain[-1]


def styles_of(line: Text, glyphs: str) -> set[str]:
    """The styles of the cells of ``line`` drawing one of ``glyphs`` (braille dots, blocks)."""
    out = set()
    for span in line.spans:
        if any(ch in glyphs or 0x2800 < ord(ch) <= 0x28FF for ch in line.plain[span.start:span.end]):
            out.add(str(span.style))
    return out


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
async def test_leaky_run_plots(size: tuple[int, int]) -> None:
    db = DATA / "leaky.sqlite"
    with RunReader(db) as reader:
        s = summarize(reader)
        tl = run_timeline(reader, s)
    app = MemscopeApp(str(db), now=frozen_clock)
    async with app.run_test(size=size) as pilot:
        await loaded()(pilot)
        lines, region = plot_lines(app, "#timeline")
        assert region.width == size[0] - 2 and region.height >= (8 if size == (80, 24) else 18)
        assert_axes(lines, "s", region.height)
        legend = lines[0].plain
        assert "host RSS" in legend and "tensors" in legend and "peak step" in legend
        await pilot.press("3")
        await pilot.pause()
        lines, region = plot_lines(app, "#leak-plot")
        assert_axes(lines, "step", region.height)
        rate = human_bytes(s.leaks[0].bytes_per_step)
        assert lines[0].plain == f"━ leak 1  ┄ verdict +{rate}/step"
        drawn = set().union(*(styles_of(t, "") for t in lines[1:-2]))
        assert {"red", "bright_black"} <= drawn, drawn  # the leak's line and the verdict's rate
        # the line climbs: its dots in the bottom row on the left, in the top rows on the right
        rows = [t.plain for t in lines[1:-2]]
        left = next(i for i, ch in enumerate(rows[-1]) if "┤" == ch) + 1
        assert any(0x2800 < ord(ch) <= 0x28FF for ch in rows[-1][left:left + 8])
        assert any(0x2800 < ord(ch) <= 0x28FF for ch in rows[0][-10:]) or any(
            0x2800 < ord(ch) <= 0x28FF for ch in rows[1][-10:])
        await pilot.press("4")
        await pilot.pause()
        lines, region = plot_lines(app, "#category-plot")
        assert_axes(lines, "step", region.height)
        assert lines[0].plain.startswith("█ parameters  █ gradients  █ optimizer state  █ activations  █ leak 1")
        assert "red" in set().union(*(styles_of(t, "█▁▂▃▄▅▆▇") for t in lines[1:-2]))  # the leak's part
    assert tl.categories.stack[-1] == "leak:0"


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
async def test_healthy_run_plots(size: tuple[int, int]) -> None:
    app = MemscopeApp(str(DATA / "healthy.sqlite"), now=frozen_clock)
    async with app.run_test(size=size) as pilot:
        await loaded()(pilot)
        lines, region = plot_lines(app, "#timeline")
        assert_axes(lines, "s", region.height)
        assert "host RSS" in lines[0].plain and "tensors" in lines[0].plain
        await pilot.press("3")
        await pilot.pause()
        assert not app.query_one("#leak-plot", Plot).display  # no leak: no plot, the diff has the room
        await pilot.press("4")
        await pilot.pause()
        lines, region = plot_lines(app, "#category-plot")
        assert_axes(lines, "step", region.height)
        assert "leak" not in lines[0].plain
        await pilot.press("m")
        await pilot.pause()
        notes = [str(n.message) for n in app._notifications]
    assert any(n.startswith("a CPU run: host RSS is the only memory metric") for n in notes), notes


# the leaky run's views at 80x24 are tests/test_snapshots.py's already
SCREENS = [("leaky", key, (160, 48)) for key in "134"] + [("healthy", key, size) for key in "14" for size in SIZES]


@pytest.mark.parametrize("run, key, size", SCREENS, ids=[f"{r}-{k}-{w}x{h}" for r, k, (w, h) in SCREENS])
def test_plot_screens(snap_compare: Any, run: str, key: str, size: tuple[int, int]) -> None:
    app = MemscopeApp(str(DATA / f"{run}.sqlite"), now=frozen_clock)
    assert snap_compare(app, press=[key], terminal_size=size, run_before=loaded())
