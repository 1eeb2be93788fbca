"""2 · Layers: which modules' forward saved the most for backward, in one profiled step."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from memscope.analysis.hotspots import Hotspot
from memscope.units import human_bytes
from memscope_tui.data import Snapshot
from memscope_tui.views import View, matches
from memscope_tui.widgets import SelectionChanged, bar, fill_table, right

# sort keys, cycled with s: (label, key function, descending)
SORTS: list[tuple[str, Any]] = [
    ("activations", lambda h: (-h.activation_bytes, h.module)),
    ("output", lambda h: (-h.output_bytes, h.module)),
    ("time", lambda h: (-h.forward_s, h.module)),
    ("backward time", lambda h: (-(h.backward_s or 0.0), h.module)),
    ("name", lambda h: h.module),
]
COLUMNS = [("module", "module"), ("type", "type"), ("activations", "act"), ("share", "share"),
           ("", "bar"), ("output", "out"), ("fwd ms", "time"), ("bwd ms", "btime"),
           ("calls", "calls")]


class LayersView(View):
    TITLE = "Layers"
    HINT = "s sort · d/D fold deeper/shallower · [ ] profiled step"
    BINDINGS = [
        Binding("s", "sort", "Sort"),
        Binding("d", "depth(-1)", "Fold"),
        Binding("D", "depth(1)", "Unfold", show=False),
        Binding("left_square_bracket", "step(-1)", "Prev step", show=False),
        Binding("right_square_bracket", "step(1)", "Next step", show=False),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sort_index = 0
        self.snap: Snapshot | None = None
        self.filter_text = ""

    def compose(self) -> ComposeResult:
        yield Static("no layer profile yet", id="layers-caption", classes="line")
        yield DataTable(id="layer-table", cursor_type="row", zebra_stripes=True)

    def show(self, snap: Snapshot, filter_text: str) -> None:
        self.snap, self.filter_text = snap, filter_text
        caption = self.query_one("#layers-caption", Static)
        if snap.layer_step is None:
            caption.update("no layer profile yet (profiled steps: --layers-first / --layers-every)")
        else:
            depth = f"folded to depth {snap.depth}" if snap.depth else "all modules"
            caption.update(Text.assemble(
                "profiled step ", (str(snap.layer_step), "bold"),
                f" ({len(snap.layer_steps)} profiled, [ ] moves) · {depth} · "
                f"sorted by {SORTS[self.sort_index][0]} (s)"))
        spots = sorted((h for h in snap.layers if matches(filter_text, h.module, h.type)),
                       key=SORTS[self.sort_index][1])
        fill_table(self.query_one("#layer-table", DataTable), COLUMNS,
                   [(h.module, _cells(h)) for h in spots], self.drawn, "layers")

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        """A click on a column title sorts by it."""
        by = {"module": "name", "act": "activations", "share": "activations", "bar": "activations",
              "out": "output", "time": "time", "btime": "backward time"}.get(str(event.column_key.value))
        if by is not None:
            self.sort_index = [label for label, _ in SORTS].index(by)
            if self.snap is not None:
                self.show(self.snap, self.filter_text)

    def action_sort(self) -> None:
        self.sort_index = (self.sort_index + 1) % len(SORTS)
        if self.snap is not None:
            self.show(self.snap, self.filter_text)

    def action_depth(self, delta: int) -> None:
        snap = self.snap
        if snap is None or snap.max_depth < 2:
            return
        current = snap.depth or snap.max_depth
        depth = min(max(current + delta, 1), snap.max_depth)
        self.post_message(SelectionChanged(depth=None if depth >= snap.max_depth else depth))

    def action_step(self, delta: int) -> None:
        snap = self.snap
        if snap is None or snap.layer_step is None:
            return
        i = snap.layer_steps.index(snap.layer_step) + delta
        if 0 <= i < len(snap.layer_steps):
            self.post_message(SelectionChanged(layer_step=snap.layer_steps[i]))


def _cells(h: Hotspot) -> list[Any]:
    return [h.module, h.type or "", right(human_bytes(h.activation_bytes)), right(f"{h.share:.0%}"),
            bar(h.share), right(human_bytes(h.output_bytes)), right(f"{h.forward_s * 1000:.1f}"),
            right("-" if h.backward_s is None else f"{h.backward_s * 1000:.1f}"),  # None: no backward ran
            right(str(h.calls))]
