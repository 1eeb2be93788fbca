"""5 · Suggestions: techniques ranked by estimated saving, with evidence and the code change."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from memscope.units import human_bytes
from memscope.display import shown, shown_text
from memscope_tui.data import Snapshot
from memscope_tui.views import View, matches
from memscope_tui.widgets import keep_figures

class SuggestionsView(View):
    TITLE = "Suggestions"

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="suggestions-scroll"):
            yield Static("", id="suggestion-list")

    def show(self, snap: Snapshot, filter_text: str) -> None:
        self.snap, self.filter_text = snap, filter_text
        wide = self.text_width(4)  # the view's padding, the scrollbar's
        box = self.query_one("#suggestion-list", Static)
        part = snap.suggestions
        if part.error is not None:
            box.update(Text(f"suggestions failed: {shown_text(part.error)}", style="bold red"))
            return
        items = [s for s in (part.value or []) if matches(filter_text, s.technique, s.evidence, s.how)]
        if not items:
            box.update(Text("no suggestions for this run" + (" (filtered)" if filter_text else ""),
                            style="dim"))
            return
        blocks: list[Table | Text] = []
        for rank, s in enumerate(items, 1):
            title = Text(f"{rank}. {shown(s.technique)}", style="bold")
            title.append(f"  saves ~{human_bytes(s.estimated_saving_bytes)}", style="bold green")
            # a grid, so that wrapped lines stay under the text, not at column 1
            body = Table.grid(padding=(0, 1))
            body.add_column(width=9, style="dim")
            # a word wider than the column (code: `model.gradient_checkpointing_enable(...`) is
            # folded onto the next line, never cut with an ellipsis
            body.add_column(ratio=1, overflow="fold")
            # Text, not str: a rich table parses a str cell as markup (a holder named [/] crashed it)
            body.add_row("evidence", keep_figures(Text(shown_text(s.evidence)), wide - 10))
            body.add_row("change", keep_figures(Text(shown_text(s.how)), wide - 10))
            blocks += [keep_figures(title, wide), body, Text("")]
        box.update(Group(*blocks[:-1]))

