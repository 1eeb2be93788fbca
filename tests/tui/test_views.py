"""Views 2-7 of the dashboard, driven with Textual's Pilot on run files of real example runs.

Each view is checked against what memscope.analysis says about the same file (the report, or the
analysis function the view is built on), never against numbers written here.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import DataTable, Static, TabbedContent

from memscope.analysis.hotspots import hotspots, layer_rows
from memscope.analysis.leaks import diff
from memscope.analysis.ranks import imbalance, rank_summaries
from memscope.analysis.suggestions import suggest
from memscope.analysis.summary import summarize
from memscope.analysis.views import breakdown_for
from memscope.units import human_bytes
from memscope.store.reader import RunReader
from memscope_tui.app import MemscopeApp


async def wait_until(pilot: Pilot[Any], predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the dashboard did not get there in time"
        await pilot.pause(0.05)


async def opened(pilot: Pilot[Any], app: MemscopeApp, key: str) -> None:
    await wait_until(pilot, lambda: app.loads >= 1)
    await pilot.press(key)
    await pilot.pause()


def text_of(app: MemscopeApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


def rendered(app: MemscopeApp, selector: str, width: int = 200) -> str:
    """A Static's renderable (a Group, a Table) as the plain text it draws."""
    from rich.console import Console

    console = Console(width=width, record=True, color_system=None)
    console.print(app.query_one(selector, Static).content)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


def column(table: DataTable[Any], index: int) -> list[str]:
    return [str(table.get_row_at(i)[index]) for i in range(table.row_count)]


async def test_number_keys_switch_views(tiny_run: Path) -> None:
    app = MemscopeApp(str(tiny_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.loads >= 1)
        tabs = app.query_one(TabbedContent)
        seen = []
        for key in "2345671":
            await pilot.press(key)
            await pilot.pause()
            seen.append(tabs.active)
        await pilot.press("tab")  # keys go to the active view, not to a hidden filter box
        assert app.filter_text == ""
    assert seen == ["layers", "leaks", "breakdown", "suggestions", "oom", "ranks", "overview"]


async def test_layers_match_the_hotspots(tiny_run: Path, tiny_report: dict[str, Any]) -> None:
    app = MemscopeApp(str(tiny_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await opened(pilot, app, "2")
        table = app.query_one("#layer-table", DataTable)
        labels = [str(c.label) for c in table.columns.values()]
        modules, shares, bars = column(table, 0), column(table, 3), column(table, 4)
        snap = app.snapshot
        caption = text_of(app, "#layers-caption")
        types = column(table, 1)
        assert table.region.width <= 80 and table.has_focus
        # at 80x24 every column shown fits: nothing is cut mid-value or scrolled off
        assert table.virtual_size.width <= table.region.width
        for _ in range(3):  # sorted by backward time: its column is kept
            await pilot.press("s")
        await pilot.pause()
        by_bwd = [str(c.label) for c in table.columns.values()]
        backward = column(table, by_bwd.index("bwd ms")) if "bwd ms" in by_bwd else []
        bwd_modules = column(table, 0)
    # the bar is wanted first (the view is a bar chart of the saved bytes), then the times
    assert labels[:5] == ["module", "type", "saved", "share", ""] and "fwd ms" in labels
    # the whole model has a row of its own, named as a person reads it
    assert types[modules.index("(model)")] == "TinyGPT"
    # backward time per module, as the analysis gives it; every real module ran a backward,
    # the "<no module>" row (the loss) is no module and has no time
    assert snap is not None and backward
    by_module = {("(model)" if h.module == "" else h.module): h for h in snap.layers}
    for name, cell in zip(bwd_modules, backward):
        b = by_module[name].backward_s
        assert (b is None) == (name == "<no module>"), name
        assert cell.strip() == ("-" if b is None else f"{b * 1000:.1f}")
    top = tiny_report["hotspots"][0]
    assert modules[0] == top["module"] and shares[0] == f"{top['share']:.0%}"
    assert set(h["module"] for h in tiny_report["hotspots"]) <= set(modules)
    assert len(bars[0].strip()) >= len(bars[-1].strip())  # the bar follows the share
    assert caption.startswith("step ")


async def test_layers_say_per_micro_batch(tmp_path_factory: pytest.TempPathFactory) -> None:
    """With gradient accumulation the caption says the rows are per micro-batch, and the rows
    are the analysis' (one micro-batch each: none above the step's activations at their peak).
    Four micro-batches of 64 rows per optimizer step: tests/test_layers_accumulation.py's run,
    made once per session (tests/shared_runs.py)."""
    from conftest import _shared

    db = _shared(tmp_path_factory, "tests/scripts/accumulate.py", "64,64,64,64")
    app = MemscopeApp(str(db))
    async with app.run_test(size=(80, 24)) as pilot:
        await opened(pilot, app, "2")
        caption = text_of(app, "#layers-caption")
        table = app.query_one("#layer-table", DataTable)
        modules, saved = column(table, 0), column(table, 2)
    assert "per micro-batch (4/step)" in caption
    with RunReader(str(db)) as reader:
        s = summarize(reader)
        assert s.hotspot_step is not None and s.main_proc is not None
        spots = hotspots(layer_rows(reader, s.main_proc, s.hotspot_step))
    assert s.hotspot_micro_batches == 4 and s.peak.breakdown is not None
    assert spots and all(h.activation_bytes <= s.peak.breakdown["activations"] for h in spots)
    assert modules[0] == spots[0].module and saved[0].strip() == human_bytes(spots[0].activation_bytes)
    assert spots[0].activation_bytes == 64 * 1024 * 4  # the ReLU's output of one micro-batch


async def test_layers_say_per_closure_evaluation(tmp_path_factory: pytest.TempPathFactory) -> None:
    """LBFGS evaluates its closure several times inside optimizer.step(): the caption says
    the rows are per forward of those evaluations, not per micro-batch. The run (3 evaluations
    a step, 12 steps, at default options: step 1 profiled) is tests/test_suggestions.py's, made
    once per session (tests/shared_runs.py)."""
    from conftest import _shared

    db = _shared(tmp_path_factory, "examples/scenarios/mlp.py", "--optimizer", "lbfgs", "--lbfgs-iter", "3",
                 "--steps", "12")
    app = MemscopeApp(str(db))
    async with app.run_test(size=(80, 24)) as pilot:
        await opened(pilot, app, "2")
        caption = text_of(app, "#layers-caption")
    assert "per forward (3 closure evaluations/step)" in caption and "micro-batch" not in caption


async def test_layers_fold_by_depth_and_sort(tiny_run: Path) -> None:
    app = MemscopeApp(str(tiny_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await opened(pilot, app, "2")
        snap = app.snapshot
        assert snap is not None and snap.max_depth >= 3 and snap.layer_step is not None
        loads = app.loads
        await pilot.press("d")  # fold one level
        await wait_until(pilot, lambda: app.loads > loads)
        await pilot.pause()
        folded_depth = app.snapshot.depth if app.snapshot else None
        modules = column(app.query_one("#layer-table", DataTable), 0)
        await pilot.press("s")  # sort by output bytes
        await pilot.pause()
        by_output = column(app.query_one("#layer-table", DataTable), 0)
        caption = text_of(app, "#layers-caption")
        await pilot.click("#layer-table", offset=(2, 0))  # the "module" column title
        await pilot.pause()
        by_name = column(app.query_one("#layer-table", DataTable), 0)
        name_caption = text_of(app, "#layers-caption")
    assert by_name == sorted(modules) and "by name" in name_caption
    assert folded_depth == snap.max_depth - 1
    with RunReader(tiny_run) as reader:
        folded = [h for h in hotspots(layer_rows(reader, snap.summary.main_proc or 1, snap.layer_step),
                                      folded_depth)]
    label = {h.module: "(model)" if h.module == "" else h.module for h in folded}
    assert modules == [label[h.module] for h in folded]
    assert by_output == [label[h.module] for h in sorted(folded, key=lambda h: (-h.output_bytes, h.module))]
    assert all(len(m.split(".")) <= folded_depth for m in modules)
    assert "by output" in caption


async def test_leaks_show_the_verdict_and_the_diff(leaky_run: Path) -> None:
    with RunReader(leaky_run) as reader:
        summary = summarize(reader)
        proc = summary.main_proc
        assert proc is not None
        inv = [int(r["step"]) for r in reader.query("SELECT step FROM inventories ORDER BY step")]
        expected = diff(reader, proc, inv[0], inv[-1])
        narrower = diff(reader, proc, inv[1], inv[-1])
    leak = summary.leaks[0]
    app = MemscopeApp(str(leaky_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await opened(pilot, app, "3")
        verdicts = text_of(app, "#verdicts")
        caption = text_of(app, "#diff-caption")
        box = app.query_one("#diff-caption", Static).content_size
        drawn = rendered(app, "#diff-caption", width=box.width).splitlines()
        table = app.query_one("#diff", DataTable)
        first = [str(c) for c in table.get_row_at(0)]
        rows = table.row_count
        await pilot.press("right_square_bracket")  # move the 'from' inventory one later
        await wait_until(pilot, lambda: app.snapshot is not None and app.snapshot.diff_from == inv[1])
        await pilot.pause()
        moved = [str(c) for c in app.query_one("#diff", DataTable).get_row_at(0)]
        await pilot.press("left_curly_bracket")  # and the 'to' inventory one earlier
        await wait_until(pilot, lambda: app.snapshot is not None and app.snapshot.diff_to == inv[-2])
        assert app.snapshot is not None and app.snapshot.diff_from == inv[1]
        tab_label = str(app.query_one(TabbedContent).get_tab("leaks").label)
    assert "LEAK" in verdicts and "loss_history" in verdicts and leak.held_by in verdicts.replace("\n", " ")
    assert f"+{human_bytes(leak.bytes_per_step)}/step" in verdicts
    assert f"step {inv[0]} → step {inv[-1]}" in caption
    assert len(drawn) <= box.height and f"{inv[-1]}" in drawn[-1], (drawn, box)  # nothing cut at 80x24
    assert rows == len(expected)
    top = expected[0]
    assert first[0] == top.category and first[4] == f"{top.count_from}→{top.count_to}"
    assert first[5] == f"+{human_bytes(top.bytes_delta)}"
    assert moved[4] == f"{narrower[0].count_from}→{narrower[0].count_to}"
    assert tab_label.endswith("1!")


async def test_filter_narrows_the_tables(tiny_run: Path) -> None:
    app = MemscopeApp(str(tiny_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await opened(pilot, app, "2")
        table = app.query_one("#layer-table", DataTable)
        before = column(table, 0)
        word = next(m for m in before if "." in m).split(".")[0]  # e.g. "blocks"
        await pilot.press("slash")
        for ch in word:
            await pilot.press(ch)
        await pilot.press("enter")
        await pilot.pause()
        after = column(table, 0)
        state = text_of(app, "#state")
        await pilot.press("escape")
        await pilot.pause()
        cleared = column(table, 0)
        await pilot.press("1")  # keys switch views again once the filter box is closed
        await pilot.pause()
        active = app.query_one(TabbedContent).active
    assert after and all(word in m for m in after) and len(after) < len(before)
    assert f"filter: {word}" in state
    assert cleared == before and active == "overview"


async def test_breakdown_at_peak_and_at_a_step(leaky_run: Path, tiny_report: dict[str, Any]) -> None:
    with RunReader(leaky_run) as reader:
        summary = summarize(reader)
        last = reader.steps(summary.main_proc)[-1]["step"]
        at_last = breakdown_for(reader, summary.main_proc, last)
        at_prev = breakdown_for(reader, summary.main_proc, last - 1)
    assert summary.peak.breakdown is not None and at_last is not None and at_prev is not None
    app = MemscopeApp(str(leaky_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await opened(pilot, app, "4")
        table = app.query_one("#breakdown-table", DataTable)
        parts = column(table, 0)
        at_peak = column(table, 1)
        labels = [str(c.label) for c in table.columns.values()]
        frag = text_of(app, "#fragmentation")
        await pilot.press("left_square_bracket")
        await wait_until(pilot, lambda: app.snapshot is not None and app.snapshot.breakdown is not None
                         and app.snapshot.breakdown.step == last - 1)
        await pilot.pause()
        prev_labels = [str(c.label) for c in app.query_one("#breakdown-table", DataTable).columns.values()]
        prev_col = column(app.query_one("#breakdown-table", DataTable), 4)
    # a leaky run: the leaking groups' bytes at the peak are a row of their own, out of other
    assert summary.peak.breakdown["leaked"] > 0
    assert parts == ["parameters", "gradients", "optimizer state", "activations", "leaked", "other"]
    assert at_peak == [human_bytes(summary.peak.breakdown[k]) for k in
                       ("parameters", "gradients", "optimizer_state", "activations", "leaked", "other")]
    assert f"step {last}" in labels and f"step {last - 1}" in prev_labels
    assert prev_col[-1] == human_bytes(at_prev.parts["other"])
    assert frag.startswith("fragmentation: CUDA only")  # a CPU run


async def test_oom_post_mortem(oom_run: Path) -> None:
    with RunReader(oom_run) as reader:
        oom = summarize(reader).oom
    assert oom is not None and oom.kind == "oom"
    app = MemscopeApp(str(oom_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await opened(pilot, app, "6")
        body = rendered(app, "#oom-body")
        status = text_of(app, "#status")
        label = str(app.query_one(TabbedContent).get_tab("oom").label)
    assert body.startswith(f"OUT OF MEMORY at step {oom.step}, {oom.phase} in module {oom.module}")
    assert f"requested {human_bytes(oom.requested_bytes)}" in body
    assert "breakdown at the failure" in body  # what was live when it failed, not a profiled step
    assert "change    a shape bug" in body  # ~3 PB: a shape bug, says the advice
    assert status.startswith("OOM (exit 1)")
    assert label.endswith("!")


async def test_oom_view_names_the_rank(ddp_oom_run: Path) -> None:
    with RunReader(ddp_oom_run) as reader:
        oom = summarize(reader).oom
    assert oom is not None and oom.rank == 1
    app = MemscopeApp(str(ddp_oom_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await opened(pilot, app, "6")
        body = rendered(app, "#oom-body")
    assert body.startswith(f"OUT OF MEMORY on rank 1 at step {oom.step}")
    assert f"where     rank 1, step {oom.step}" in body


async def test_no_oom_says_so(tiny_run: Path) -> None:
    app = MemscopeApp(str(tiny_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await opened(pilot, app, "6")
        assert text_of(app, "#oom-body") == "no out-of-memory error in this run"


async def test_suggestions_view(leaky_run: Path) -> None:
    app = MemscopeApp(str(leaky_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await opened(pilot, app, "5")
        box = app.query_one("#suggestion-list", Static)
        console = Console(width=box.content_region.width, record=True, file=io.StringIO())
        console.print(box.content)
        body = console.export_text()
        snap = app.snapshot
    assert snap is not None
    with RunReader(leaky_run) as reader:
        expected = suggest(reader)
    assert snap.suggestions.error is None
    assert expected, "a leaking run gets at least the fix_leak suggestion"
    first = expected[0]
    assert body.startswith(f"1. {first.technique}  saves ~{human_bytes(first.estimated_saving_bytes)}")
    lines = body.splitlines()
    assert "fix_leak" in body and any(ln.startswith("evidence ") for ln in lines)
    assert any(ln.startswith("change ") for ln in lines)
    # wrapped text stays under its column (issue #15: it wrapped to column 1 at 80x24)
    body_lines = [ln for ln in lines[1:] if ln.strip() and not ln[0].isdigit()]
    assert len(body_lines) > 2 and all(ln.startswith(("evidence ", "change ", " " * 10)) for ln in body_lines)


async def test_ranks_view(ddp_run: Path) -> None:
    app = MemscopeApp(str(ddp_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await opened(pilot, app, "7")
        caption = text_of(app, "#ranks-caption")
        table = app.query_one("#rank-table", DataTable)
        ranks, peaks = column(table, 0), column(table, 4)
    with RunReader(ddp_run) as reader:
        expected = rank_summaries(reader)
    assert ranks == ["0", "1"]
    assert peaks == [human_bytes(r.peak_bytes) for r in expected]
    assert caption.startswith("2 ranks")
    imb = imbalance(expected)
    if imb is not None:
        assert f"peak imbalance {imb:.0%}" in caption


async def test_single_process_has_no_ranks_table(tiny_run: Path) -> None:
    app = MemscopeApp(str(tiny_run))
    async with app.run_test(size=(80, 24)) as pilot:
        await opened(pilot, app, "7")
        assert text_of(app, "#ranks-caption") == "a single process: no ranks to compare"
        assert app.query_one("#rank-table", DataTable).row_count == 0
