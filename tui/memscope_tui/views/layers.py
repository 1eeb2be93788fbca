"""2 · Layers: which modules' forward saved the most for backward, in one profiled step."""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from memscope.analysis.hotspots import Hotspot, compiled_note
from memscope.display import shown
from memscope.names import module_label
from memscope.units import human_bytes
from memscope_tui.data import Snapshot
from memscope_tui.views import View, matches
from memscope_tui.widgets import (BAR_CELLS, RowTable, SelectionChanged, bar, cell_text, fill_table, fit_columns,
                                   keep_figures, plain, right, shorten_cells, table_room)

# sort keys, cycled with s: (label, key function, the column it sorts by)
SORTS: list[tuple[str, Any, str]] = [
    ("activations", lambda h: (-h.activation_bytes, h.module), "act"),
    ("output", lambda h: (-h.output_bytes, h.module), "out"),
    ("forward time", lambda h: (-h.forward_s, h.module), "time"),
    ("backward time", lambda h: (-(h.backward_s or 0.0), h.module), "btime"),
    ("name", lambda h: h.module, "module"),
]
COLUMNS = [("module", "module"), ("type", "type"), ("saved", "act"), ("share", "share"),
           ("", "bar"), ("output", "out"), ("fwd ms", "time"), ("bwd ms", "btime"),
           ("calls", "calls")]
# columns dropped first when the terminal is narrow (80x24): calls, then output...; the column
# the table is sorted by is always kept, and so are saved and share (not in this list). The bar
# is wanted most: the view is a bar chart of the modules' saved bytes, and takes the room left.
OPTIONAL = ["bar", "time", "btime", "out", "calls"]
BAR_MAX = 60  # cells the bar grows to on a wide terminal
# narrowed before any column is dropped: fewest cells (a long name is shortened from the middle;
# the detail line under the table shows the highlighted row's full name and every figure)
SHRINK = {"module": 30, "type": 10}


class LayersView(View):
    TITLE = "Layers"
    HINT = "s sort · d fold one level up · D unfold · [ ] profiled step"
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
        self.by_key: dict[str, Hotspot] = {}  # row key -> its hotspot, for the detail line

    def compose(self) -> ComposeResult:
        yield Static("no layer profile yet", id="layers-caption", classes="line")
        yield RowTable(id="layer-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="layer-detail", classes="caption")

    def show(self, snap: Snapshot, filter_text: str) -> None:
        self.snap, self.filter_text = snap, filter_text
        caption = self.query_one("#layers-caption", Static)
        if snap.layer_step is None:
            caption.update("no layer profile yet (profiled steps: --layers-first / --layers-every)")
        else:
            depth = f"depth {snap.depth}" if snap.depth else "all modules"
            micro = snap.layer_micro_batches
            # gradient accumulation: a row is one micro-batch (the module's largest), not the step
            per = f"per micro-batch ({micro}/step) · " if micro is not None and micro > 1 else ""
            if micro is not None and micro > 1 and snap.layer_closure_forwards >= micro:  # LBFGS
                per = f"per forward ({micro} closure evaluations/step) · "
            caption.update(Text.assemble(
                "step ", (str(snap.layer_step), "bold"),
                f" ({len(snap.layer_steps)} profiled) · {per}{depth} · "
                f"by {SORTS[self.sort_index][0]} · s d D [ ]"))
        _label, key, column = SORTS[self.sort_index]
        spots = sorted((h for h in snap.layers if matches(filter_text, module_label(h.module, h.type), h.type)),
                       key=key)
        rows = [(h.module, _cells(h)) for h in spots]
        self.by_key = {h.module: h for h in spots}
        priority = [column] + [c for c in OPTIONAL if c != column]
        table = self.query_one("#layer-table", DataTable)
        room = table_room(table, self.size.width or 80)
        picked, narrow = fit_columns(COLUMNS, [cells for _, cells in rows], room, priority, SHRINK)
        bar_at = [k for _, k in COLUMNS].index("bar")
        if bar_at in picked and not narrow:  # the bars take the room the other columns leave
            used = sum(max([cell_len(COLUMNS[i][0])] + [cell_len(cell_text(c[i])) for _, c in rows]) + 2
                       for i in picked)
            wide = min(BAR_CELLS + max(room - used, 0), BAR_MAX)
            rows = [(k, [*c[:bar_at], bar(h.share, wide), *c[bar_at + 1:]]) for (k, c), h in zip(rows, spots)]
        fill_table(table, [COLUMNS[i] for i in picked],
                   [(k, [cells[i] for i in picked]) for k, cells in
                    ((k, shorten_cells(cells, narrow)) for k, cells in rows)], self.drawn, "layers")
        self._detail(table)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._detail(event.data_table)

    def _detail(self, table: DataTable[Any]) -> None:
        """The highlighted row in full: its whole name and every figure, shown or not."""
        box = self.query_one("#layer-detail", Static)
        h = None
        if table.row_count:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
            h = self.by_key.get(str(key))
        box.update(Text() if h is None else keep_figures(detail_text(h), self.text_width()))

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        """A click on a column title sorts by it."""
        by = {"module": "name", "act": "activations", "share": "activations", "bar": "activations",
              "out": "output", "time": "forward time", "btime": "backward time"}.get(str(event.column_key.value))
        if by is not None:
            self.sort_index = [label for label, _, _ in SORTS].index(by)
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


def detail_text(h: Hotspot) -> Text:
    """One module's row in full, for the line under the table (names are never shortened here)."""
    text = Text()
    text.append(shown("(model)" if h.module == "" else h.module), style="bold")
    if h.type:
        text.append(f" ({shown(h.type)})")
    bwd = "-" if h.backward_s is None else f"{h.backward_s * 1000:.1f} ms"
    text.append(f"\nsaved {human_bytes(h.activation_bytes)} ({h.share:.0%}) · output "
                f"{human_bytes(h.output_bytes)} · fwd {h.forward_s * 1000:.1f} ms · bwd {bwd} · "
                f"{h.calls} call{'s' if h.calls != 1 else ''}")
    if note := compiled_note([h], shown):
        text.append(f"\n{note}", style="dim")
    return text


def _cells(h: Hotspot) -> list[Any]:
    name = "(model)" if h.module == "" else h.module  # its type is in the next column
    return [plain(name), plain(h.type or ""), right(human_bytes(h.activation_bytes)), right(f"{h.share:.0%}"),
            bar(h.share), right(human_bytes(h.output_bytes)), right(f"{h.forward_s * 1000:.1f}"),
            right("-" if h.backward_s is None else f"{h.backward_s * 1000:.1f}"),  # None: no backward ran
            right(str(h.calls))]
