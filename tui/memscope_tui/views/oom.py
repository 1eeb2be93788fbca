"""6 · OOM: the post-mortem when the run ran out of memory (or was killed).

The same facts as ``memscope oom`` (memscope.analysis.oom.facts): what and where, memory against
the limits, the CUDA allocator's state and memory outside PyTorch, what was live at the failure
by category and by module (or by allocation site, for an imported snapshot), what to change.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from memscope.analysis.oom import facts
from memscope.display import shown, shown_text
from memscope_tui.data import Snapshot
from memscope_tui.views import View
from memscope_tui.widgets import keep_figures

_LABEL = 10
_STYLE = {"what": "bold", "change": "bold green", "breakdown": "bold", "by module": "bold",
          "by site": "bold", "allocator": "bold", "outside": "bold", "memory": "bold", "where": "bold"}


class OomView(View):
    TITLE = "OOM"

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("", id="oom-body")

    def show(self, snap: Snapshot, filter_text: str) -> None:
        self.snap, self.filter_text = snap, filter_text
        box = self.query_one("#oom-body", Static)
        r = snap.summary.oom
        if r is None:
            box.update(Text("no out-of-memory error in this run" +
                            (" (so far)" if snap.summary.status == "running" else ""), style="green"))
            return
        title = Text()
        title.append("OUT OF MEMORY" if r.kind == "oom" else "KILLED", style="bold red")
        if r.rank is not None:
            title.append(f" on rank {r.rank}")
        title.append(f" at step {r.step if r.step is not None else '?'}")
        if r.phase:
            title.append(f", {shown(r.phase)}")
        if r.module:
            title.append(" in module ")
            title.append(shown(r.module), style="bold")
        title.append("\n")
        # two columns: a long fact wraps under its own text, not under the labels
        wide = self.text_width(4)  # the view's padding, the scrollbar's (a long post-mortem scrolls)
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=_LABEL - 1, no_wrap=True)
        grid.add_column(ratio=1)
        section = ""
        for label, text in facts(r):
            section = label or section
            grid.add_row(Text(label, style=_STYLE.get(label, "bold")),
                         keep_figures(Text(shown_text(text), style="green" if section == "change" else ""),
                                      wide - _LABEL))
        box.update(Group(keep_figures(title, wide), grid))
