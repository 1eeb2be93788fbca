"""5 · Suggestions: techniques ranked by estimated saving, with evidence and the code change."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from memscope.report.format import human_bytes
from memscope_tui.data import Snapshot
from memscope_tui.views import View, matches

NOT_AVAILABLE = "suggestions are not available in this version of memscope"


class SuggestionsView(View):
    TITLE = "Suggestions"

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="suggestions-scroll"):
            yield Static("", id="suggestion-list")

    def show(self, snap: Snapshot, filter_text: str) -> None:
        box = self.query_one("#suggestion-list", Static)
        part = snap.suggestions
        if not part.available:
            box.update(Text(NOT_AVAILABLE, style="dim"))
            return
        if part.error is not None:
            box.update(Text(f"suggestions failed: {part.error}", style="bold red"))
            return
        items = [s for s in (part.value or [])
                 if matches(filter_text, _get(s, "technique"), _get(s, "evidence"), _get(s, "how"))]
        if not items:
            box.update(Text("no suggestions for this run" + (" (filtered)" if filter_text else ""),
                            style="dim"))
            return
        out = Text()
        for rank, s in enumerate(items, 1):
            if rank > 1:
                out.append("\n\n")
            out.append(f"{rank}. {_get(s, 'technique')}", style="bold")
            saving = _get(s, "estimated_saving_bytes")
            out.append(f"  saves ~{human_bytes(saving)}" if saving is not None else "  saving unknown",
                       style="bold green")
            out.append(f"\n   evidence: {_get(s, 'evidence')}")
            out.append(f"\n   change:   {_get(s, 'how')}")
        box.update(out)


def _get(s: Any, name: str) -> Any:
    """A field of a Suggestion (dataclass) or of a suggestion dict."""
    return s.get(name) if isinstance(s, dict) else getattr(s, name, None)
