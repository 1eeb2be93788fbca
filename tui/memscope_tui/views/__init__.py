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
        self.snap: Snapshot | None = None  # the snapshot drawn last (show sets it)
        self.filter_text = ""

    def show(self, snap: Snapshot, filter_text: str) -> None:
        raise NotImplementedError

    def on_resize(self) -> None:
        """Columns and wrapped lines are laid out for the width: lay them out again."""
        if self.snap is not None:
            self.show(self.snap, self.filter_text)

    def text_width(self, padding: int = 2) -> int:
        """Cells a line of text has in this view (80 columns before the first layout)."""
        return (self.size.width or 80) - padding


def matches(filter_text: str, *fields: object) -> bool:
    """The ``/`` filter: every word of it appears in one of ``fields`` (case-insensitive)."""
    if not filter_text:
        return True
    hay = " ".join("" if f is None else str(f) for f in fields).lower()
    return all(word in hay for word in filter_text.lower().split())
