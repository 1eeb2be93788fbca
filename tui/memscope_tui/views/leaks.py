"""3 · Leaks: the verdicts, and what changed between two tensor inventories."""

from __future__ import annotations

import shlex
from typing import Any, Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from memscope.analysis.leaks import GroupDiff, Leak
from memscope.analysis.summary import RunSummary
from memscope.units import human_bytes
from memscope.display import shown, shown_text
from memscope_tui.data import Snapshot
from memscope_tui.plot import Curve, Figure, Plot
from memscope_tui.views import View, matches
from memscope_tui.widgets import (RowTable, SelectionChanged, fill_table, fit_columns, keep_figures, plain, right,
                                   shorten_cells, table_room)

VERDICT_LINES = 5  # the verdicts' share of the view: app.tcss #verdicts max-height (the rest is the diff)
DIFF_COLUMNS = [("category", "cat"), ("dtype", "dtype"), ("shape", "shape"), ("grad_fn", "fn"),
                ("tensors", "count"), ("Δ bytes", "delta"), ("now", "bytes")]
# narrow (80 columns): shapes and grad_fn names are shortened from the middle (whole in the
# detail line), then "now" is dropped; the counts and Δ bytes always show
DIFF_SHRINK = {"shape": 12, "fn": 12, "cat": 11}
DIFF_OPTIONAL = ["bytes"]


def leak_line(lk: Leak) -> Text:
    text = Text()
    text.append("LEAK ", style="bold red")
    if lk.kind == "graph":
        text.append(f"~{human_bytes(lk.bytes_per_step)}/step", style="bold")
        text.append(f" ({lk.node_cost.phrase()})")
        text.append(shown_text(f" autograd graph kept by {lk.category} {lk.dtype} {lk.shape}"
                               f" ({lk.grad_fn}), {lk.graph_nodes_per_step:g} nodes/step"))
    else:
        text.append(f"+{human_bytes(lk.bytes_per_step)}/step", style="bold")
        text.append(shown_text(f" {lk.category} {lk.dtype} {lk.shape}"))
        if lk.grad_fn:
            text.append(f" ({shown(lk.grad_fn)})")
    text.append(f" steps {lk.first_step}–{lk.last_step}")
    text.append(f" · held by {shown(lk.held_by or '?')}")
    if lk.site:
        text.append(f" · {shown(lk.site)}")
    return text


def verdict_text(summary: RunSummary, inventoried: int,
                 height: Callable[[Text], int] = lambda _: 1, budget: int = VERDICT_LINES) -> Text:
    """The leak verdicts: leaks, or none (only after enough inventories), or what is missing;
    memory growth no tensor group explains; DataLoader workers copying their dataset.
    ``height`` says how many screen lines a line of text wraps to: the leaks fill what the other
    verdicts leave of ``budget`` lines, whole, and a last line counts those left out."""
    lines: list[Text] = []
    check = summary.leak_check
    if not summary.leaks:
        if not inventoried:
            lines.append(Text("no tensor inventories yet: " + check.advice(), style="dim"))
        elif check.verdict == "ok":
            lines.append(Text(f"no leaks in {check.inventories} inventories", style="green"))
        else:
            lines.append(Text("not enough inventories to tell yet: " + check.advice(), style="bold yellow"))
    u = summary.unexplained
    if u is not None:
        metric = u.label
        lines.append(Text.assemble(("GROWTH ", "bold red"), (f"+{human_bytes(u.bytes_per_step)}/step", "bold"),
                                   f" {metric} from step {u.first_step} that no tensor group explains"))
    w = summary.workers
    if w is not None:
        lines.append(Text.assemble(("WORKERS ", "bold red"),
                                   f"{w.workers} DataLoader worker(s) copied "
                                   f"{human_bytes(w.uss_end - w.uss_start)} of their dataset "
                                   "(copy-on-read: hold it in numpy arrays / Arrow)"))
    room = budget - sum(height(line) for line in lines)
    leaks: list[Text] = []
    for i, lk in enumerate(summary.leaks):
        line = leak_line(lk)
        rest = len(summary.leaks) - i - 1
        if height(line) + (1 if rest else 0) > room:
            left = len(summary.leaks) - i
            leaks.append(Text(f"+{left} more leak{'s' if left > 1 else ''}: "
                              f"memscope leaks {shown(shlex.quote(summary.path))} lists all",
                              style="bold red"))
            break
        leaks.append(line)
        room -= height(line)
    return Text("\n").join(leaks + lines)


class LeaksView(View):
    TITLE = "Leaks"
    HINT = "[ ] move the 'from' inventory · { } move the 'to' inventory"
    BINDINGS = [
        Binding("left_square_bracket", "move('diff_from', -1)", "From ←", show=False),
        Binding("right_square_bracket", "move('diff_from', 1)", "From →", show=False),
        Binding("left_curly_bracket", "move('diff_to', -1)", "To ←", show=False),
        Binding("right_curly_bracket", "move('diff_to', 1)", "To →", show=False),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.by_key: dict[str, GroupDiff] = {}  # row key -> its group, for the detail line

    def compose(self) -> ComposeResult:
        yield Static("", id="verdicts")
        yield Plot(id="leak-plot")
        yield Static("", id="diff-caption", classes="caption")  # wraps to two lines at 80 columns
        yield RowTable(id="diff", cursor_type="row", zebra_stripes=True)
        yield Static("", id="diff-detail", classes="caption")

    def show(self, snap: Snapshot, filter_text: str) -> None:
        self.snap, self.filter_text = snap, filter_text
        wide = self.text_width()
        self.query_one("#verdicts", Static).update(keep_figures(verdict_text(
            snap.summary, len(snap.inventory_steps), lambda text: len(keep_figures(text, wide).split("\n"))),
            wide))
        plot = self.query_one("#leak-plot", Plot)
        plot.display = bool(snap.leak_growth)
        plot.figure = leak_figure(snap) if snap.leak_growth else None
        caption = self.query_one("#diff-caption", Static)
        if snap.diff_from is None or snap.diff_to is None:
            caption.update("")
        else:
            caption.update(keep_figures(Text.assemble(
                "diff of inventories ", (f"step {snap.diff_from}", "bold"), " → ",
                (f"step {snap.diff_to}", "bold"),
                f" · {len(snap.diff)} groups changed · [ ] from, {{ }} to",
                (f" · inventories at {_steps(snap.inventory_steps, 6)}", "dim")), wide))
        keyed = [(f"{d.category}|{d.dtype}|{d.shape}|{d.grad_fn}|{d.device}|{i}", d)
                 for i, d in enumerate(snap.diff)
                 if matches(filter_text, d.category, d.dtype, d.shape, d.grad_fn)]
        self.by_key = dict(keyed)
        rows = [(k, _cells(d)) for k, d in keyed]
        table = self.query_one("#diff", DataTable)
        picked, narrow = fit_columns(DIFF_COLUMNS, [cells for _, cells in rows],
                                     table_room(table, self.size.width or 80), DIFF_OPTIONAL, DIFF_SHRINK)
        fill_table(table, [DIFF_COLUMNS[i] for i in picked],
                   [(k, [c[i] for i in picked]) for k, c in ((k, shorten_cells(c, narrow)) for k, c in rows)],
                   self.drawn, "diff")
        self._detail(table)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._detail(event.data_table)

    def _detail(self, table: DataTable[Any]) -> None:
        """The highlighted group in full (its shape and grad_fn may be shortened in the table)."""
        box = self.query_one("#diff-detail", Static)
        d = None
        if table.row_count:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
            d = self.by_key.get(str(key))
        box.update(Text() if d is None else keep_figures(Text(shown_text(
            f"{d.category} {d.dtype or ''} {d.shape} {d.grad_fn or '(no grad_fn)'} on {d.device}: "
            f"{d.count_from}→{d.count_to} tensors, {'+' if d.bytes_delta > 0 else '-'}"
            f"{human_bytes(abs(d.bytes_delta))}, now {human_bytes(d.bytes_to)}")), self.text_width()))

    def action_move(self, which: str, delta: int) -> None:
        snap = self.snap
        if snap is None or snap.diff_from is None or snap.diff_to is None:
            return
        steps = snap.inventory_steps
        current = snap.diff_from if which == "diff_from" else snap.diff_to
        i = steps.index(current) + delta
        if 0 <= i < len(steps):
            pair = {"diff_from": snap.diff_from, "diff_to": snap.diff_to, which: steps[i]}
            self.post_message(SelectionChanged(**pair))


LEAK_COLORS = ["red", "magenta", "yellow", "cyan"]
FIT_COLOR = "bright_black"  # the verdict's rate, dashed over the group's own line


def leak_figure(snap: Snapshot) -> Figure:
    """Each leaking group's bytes at the inventories, and the verdict's fitted rate (dashed) over
    the steps it grew in."""
    curves = []
    for i, g in enumerate(snap.leak_growth):
        color = LEAK_COLORS[i % len(LEAK_COLORS)]
        curves.append(Curve(f"leak {i + 1}", [(float(s), float(v)) for s, v in g.points], color))
        if g.fit is not None:
            (s0, v0), (s1, v1) = g.fit
            curves.append(Curve(f"verdict +{human_bytes(g.leak.bytes_per_step)}/step", [(s0, v0), (s1, v1)],
                                FIT_COLOR, dashed=True))
    return Figure("step", curves, empty="no inventory holds the leaking groups")


def _steps(steps: list[int], first: int) -> str:
    """The first few inventory steps and the last (a dense cadence has dozens)."""
    shown = ", ".join(str(s) for s in steps[:first])
    return shown + (f" … {steps[-1]} ({len(steps)} in all)" if len(steps) > first else "")


def _cells(d: GroupDiff) -> list[Any]:
    sign = "+" if d.bytes_delta > 0 else "-"
    return [plain(d.category), plain(d.dtype or ""), plain(str(d.shape)), plain(d.grad_fn or ""),
            right(f"{d.count_from}→{d.count_to}"),
            Text(f"{sign}{human_bytes(abs(d.bytes_delta))}", justify="right",
                 style="bold red" if d.bytes_delta > 0 else "green"),
            right(human_bytes(d.bytes_to))]
