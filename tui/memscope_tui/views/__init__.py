"""One module per dashboard view; each is a container with ``show(snapshot, filter_text)``."""

from __future__ import annotations

from typing import Any

from textual.containers import Vertical

from memscope_tui.data import Snapshot


class View(Vertical):
    """A dashboard view: draws a :class:`Snapshot`; keeps no data of its own beyond drawing state."""

    TITLE = ""
    HINT = ""  # one line of keys for this view, shown in the help screen

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.drawn: dict[str, Any] = {}  # what each table shows, to skip unchanged redraws

    def show(self, snap: Snapshot, filter_text: str) -> None:
        raise NotImplementedError


def matches(filter_text: str, *fields: object) -> bool:
    """The ``/`` filter: every word of it appears in one of ``fields`` (case-insensitive)."""
    if not filter_text:
        return True
    hay = " ".join("" if f is None else str(f) for f in fields).lower()
    return all(word in hay for word in filter_text.lower().split())
