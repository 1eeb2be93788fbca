"""3 · Leaks: the verdicts, and what changed between two tensor inventories."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from memscope.analysis.leaks import GroupDiff, Leak
from memscope.analysis.summary import RunSummary
from memscope.units import human_bytes
from memscope.display import shown, shown_text
from memscope_tui.data import Snapshot
from memscope_tui.views import View, matches
from memscope_tui.widgets import SelectionChanged, fill_table, plain, right

DIFF_COLUMNS = [("category", "cat"), ("dtype", "dtype"), ("shape", "shape"), ("grad_fn", "fn"),
                ("tensors", "count"), ("Δ bytes", "delta"), ("now", "bytes")]


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


def verdict_text(summary: RunSummary, inventoried: int) -> Text:
    """The leak verdicts: leaks, or none (only after enough inventories), or what is missing;
    memory growth no tensor group explains; DataLoader workers copying their dataset."""
    lines = [leak_line(lk) for lk in summary.leaks[:4]]
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
    return Text("\n").join(lines)


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
        self.snap: Snapshot | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="verdicts")
        yield Static("", id="diff-caption", classes="caption")  # wraps to two lines at 80 columns
        yield DataTable(id="diff", cursor_type="row", zebra_stripes=True)

    def show(self, snap: Snapshot, filter_text: str) -> None:
        self.snap = snap
        self.query_one("#verdicts", Static).update(verdict_text(snap.summary, len(snap.inventory_steps)))
        caption = self.query_one("#diff-caption", Static)
        if snap.diff_from is None or snap.diff_to is None:
            caption.update("")
        else:
            caption.update(Text.assemble(
                "diff of inventories ", (f"step {snap.diff_from}", "bold"), " → ",
                (f"step {snap.diff_to}", "bold"),
                f" · {len(snap.diff)} groups changed · [ ] from, {{ }} to",
                (f" · inventories at {_steps(snap.inventory_steps, 6)}", "dim")))
        rows = [(f"{d.category}|{d.dtype}|{d.shape}|{d.grad_fn}|{d.device}|{i}", _cells(d))
                for i, d in enumerate(snap.diff)
                if matches(filter_text, d.category, d.dtype, d.shape, d.grad_fn)]
        fill_table(self.query_one("#diff", DataTable), DIFF_COLUMNS, rows, self.drawn, "diff")

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
