"""5 · Suggestions: techniques ranked by estimated saving, with evidence and the code change."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from memscope.units import human_bytes
from memscope_tui.data import Snapshot
from memscope_tui.views import View, matches

class SuggestionsView(View):
    TITLE = "Suggestions"

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="suggestions-scroll"):
            yield Static("", id="suggestion-list")

    def show(self, snap: Snapshot, filter_text: str) -> None:
        box = self.query_one("#suggestion-list", Static)
        part = snap.suggestions
        if part.error is not None:
            box.update(Text(f"suggestions failed: {part.error}", style="bold red"))
            return
        items = [s for s in (part.value or []) if matches(filter_text, s.technique, s.evidence, s.how)]
        if not items:
            box.update(Text("no suggestions for this run" + (" (filtered)" if filter_text else ""),
                            style="dim"))
            return
        out = Text()
        for rank, s in enumerate(items, 1):
            if rank > 1:
                out.append("\n\n")
            out.append(f"{rank}. {s.technique}", style="bold")
            out.append(f"  saves ~{human_bytes(s.estimated_saving_bytes)}", style="bold green")
            out.append(f"\n   evidence: {s.evidence}")
            out.append(f"\n   change:   {s.how}")
        box.update(out)

