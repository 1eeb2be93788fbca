"""4 · Breakdown: parameters / gradients / optimizer state / activations / other, at the peak and at
a chosen step; the CUDA allocator's unused reserved memory (fragmentation)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from memscope.analysis.categories import CategoryTimeline
from memscope.analysis.views import BREAKDOWN_PARTS
from memscope.units import human_bytes
from memscope_tui.data import Snapshot
from memscope_tui.plot import Bars, Figure, Plot
from memscope_tui.views import View
from memscope_tui.widgets import SelectionChanged, bar, fill_table, keep_figures, right

PARTS = (*BREAKDOWN_PARTS, "leaked", "other")  # leaked: at the peak only, where the run has leaks
PART_COLORS = {"parameters": "blue", "gradients": "yellow", "optimizer_state": "green", "activations": "magenta",
               "leaked": "red", "other": "bright_black"}
LEAK_COLORS = ["red", "bright_red"]


class BreakdownView(View):
    TITLE = "Breakdown"
    HINT = "[ ] the step of the second column"
    BINDINGS = [
        Binding("left_square_bracket", "step(-1)", "Prev step", show=False),
        Binding("right_square_bracket", "step(1)", "Next step", show=False),
    ]

    def compose(self) -> ComposeResult:
        yield Static("", id="category-caption", classes="caption")
        yield Plot(id="category-plot")
        yield Static("", id="breakdown-caption", classes="caption")
        yield DataTable(id="breakdown-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="fragmentation")

    def show(self, snap: Snapshot, filter_text: str) -> None:
        self.snap, self.filter_text = snap, filter_text
        wide = self.text_width()
        peak = snap.summary.peak
        at_peak = peak.breakdown
        bd = snap.breakdown
        self._show_categories(snap)
        caption = self.query_one("#breakdown-caption", Static)
        if at_peak is None and bd is None:
            caption.update(Text("no breakdown yet: it is measured in profiled steps", style="dim"))
        else:
            caption.update(keep_figures(Text.assemble(
                "at peak ", (f"step {peak.step}", "bold"), f" ({human_bytes(peak.bytes)})",
                *(() if bd is None else (" · and at ", (f"step {bd.step}", "bold"),
                                         f" ({human_bytes(bd.peak_bytes)}, measured in step "
                                         f"{bd.source_step}) · [ ] step"))), wide))
        columns = [("part", "part"), ("at peak", "peak"), ("share", "share"), ("", "bar")]
        if bd is not None:
            columns += [(f"step {bd.step}", "step"), ("share", "share2")]
        rows: list[tuple[str, list[Any]]] = []
        total_peak = sum(at_peak.values()) if at_peak else 0
        total_step = sum(bd.parts.values()) if bd else 0
        for part in PARTS:
            if part == "leaked" and not (at_peak and at_peak.get("leaked")):
                continue  # nothing leaked at the peak: no row
            v = at_peak.get(part) if at_peak else None
            share = (v or 0) / total_peak if total_peak else 0.0
            cells: list[Any] = [part.replace("_", " "), right(human_bytes(v)),
                                right(f"{share:.0%}" if at_peak else "-"), bar(share)]
            if bd is not None:
                w = bd.parts.get(part)  # a profiled step's own parts: no "leaked"
                share2 = f"{w / total_step:.0%}" if total_step and w is not None else "-"
                cells += [right(human_bytes(w)), right(share2)]
            rows.append((part, cells))
        fill_table(self.query_one("#breakdown-table", DataTable), columns, rows, self.drawn, "breakdown")
        frag = snap.fragmentation
        box = self.query_one("#fragmentation", Static)
        if frag is None:
            box.update(Text("fragmentation: CUDA only (this run has no CUDA allocator samples)",
                            style="dim"))
        else:
            box.update(keep_figures(Text.assemble(
                ("fragmentation ", "bold"), f"at {frag.t:.1f}s, when most was reserved: ",
                (human_bytes(frag.reserved), "bold"), " reserved, ", human_bytes(frag.allocated),
                " allocated, ", (f"{human_bytes(frag.unused)} unused ({frag.ratio:.0%})",
                                 "bold red" if frag.ratio > 0.3 else "bold"),
                f"; inactive split blocks {human_bytes(frag.inactive_split)}"
                f"; allocator retries {frag.alloc_retries if frag.alloc_retries is not None else '-'}"), wide))

    def _show_categories(self, snap: Snapshot) -> None:
        cats = snap.categories
        caption = self.query_one("#category-caption", Static)
        plot = self.query_one("#category-plot", Plot)
        has = cats is not None and bool(cats.points)
        plot.display = has
        if cats is None or not cats.points:
            caption.update(Text("by category over the steps: no tensor inventory or profiled step yet", style="dim"))
            plot.figure = None
            return
        moment = "tensors at inventoried steps' ends" if cats.at == "end" else "at profiled steps' peaks"
        unstacked = "" if "other" in cats.stack else f" · other ({cats.metric_label}) not stacked"
        caption.update(keep_figures(Text.assemble(("by category over the steps", "bold"), f" · {moment}{unstacked}"),
                                    self.text_width()))
        plot.figure = category_figure(cats)

    def action_step(self, delta: int) -> None:
        snap = self.snap
        if snap is None or snap.breakdown is None or not snap.breakdown_steps:
            return
        steps = snap.breakdown_steps
        i = steps.index(snap.breakdown.step) + delta if snap.breakdown.step in steps else len(steps) - 1
        if 0 <= i < len(steps):
            self.post_message(SelectionChanged(breakdown_step=steps[i]))


def category_figure(cats: CategoryTimeline) -> Figure:
    """Stacked bars, one per category point, in the model's stack order (a leak: "leak N")."""
    parts = []
    for key in cats.stack:
        label = f"leak {int(key[5:]) + 1}" if key.startswith("leak:") else cats.labels.get(key, key)
        color = (LEAK_COLORS[int(key[5:]) % len(LEAK_COLORS)] if key.startswith("leak:")
                 else PART_COLORS.get(key, "white"))
        parts.append((label, color, [float(p.parts.get(key, 0)) for p in cats.points]))
    return Figure("step", bars=Bars([float(p.step) for p in cats.points], parts))
