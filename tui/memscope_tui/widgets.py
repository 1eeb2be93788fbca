"""Small widgets and text helpers shared by the views (drawing only, no analysis)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import DataTable

from memscope.analysis.timeline import StepMark
from memscope.display import NAME_LIMIT, shown

BAR_CELLS = 10


def bar(share: float, width: int = BAR_CELLS) -> Text:
    """A share in [0, 1] as a bar of ``width`` cells (eighth blocks), readable in any theme."""
    share = min(max(share, 0.0), 1.0)
    eighths = round(share * width * 8)
    full, rest = divmod(eighths, 8)
    body = "█" * full + ("▏▎▍▌▋▊▉"[rest - 1] if rest else "")
    return Text(body.ljust(width))  # no fixed colour: the theme's text colour reads on light and dark


def right(value: str) -> Text:
    return Text(shown(value), justify="right")


def plain(value: object, limit: int = NAME_LIMIT, style: str = "") -> Text:
    """A string from the run file as a cell or a line: plain text (never markup: a name like
    ``[@click=quit]`` is shown, not run) through memscope.display (no control characters)."""
    return Text(shown(value, limit), style=style)


def fill_table(table: DataTable[Any], columns: list[tuple[str, str]], rows: list[tuple[str, list[Any]]],
               state: dict[str, Any], name: str) -> None:
    """Replace ``table``'s rows (and columns when they changed), keeping the cursor where it was.
    ``state[name]`` remembers what is shown so an unchanged refresh does not redraw."""
    key = (tuple(columns), tuple((k, tuple(str(c) for c in cells)) for k, cells in rows))
    if state.get(name) == key:
        return
    cursor = table.cursor_row
    if state.get(name + ":columns") != tuple(columns):
        table.clear(columns=True)
        for label, col_key in columns:
            table.add_column(label, key=col_key)
        state[name + ":columns"] = tuple(columns)
    else:
        table.clear()
    for row_key, cells in rows:
        # a str cell would be parsed as markup by the table: data is drawn as plain text only
        table.add_row(*(plain(c) if isinstance(c, str) else c for c in cells), key=row_key)
    state[name] = key
    if rows:
        table.move_cursor(row=min(max(cursor, 0), len(rows) - 1))


def fit_columns(columns: list[tuple[str, str]], rows: list[list[Any]], width: int,
                priority: list[str]) -> list[int]:
    """Indices of the columns to show in ``width`` cells: every column when they fit, else the
    columns not in ``priority`` plus as many of ``priority`` (most wanted first) as fit. A
    DataTable cell is its widest value plus one cell of padding each side."""
    def need(i: int) -> int:
        return max([len(columns[i][0])] + [len(shown(c)) if isinstance(c, str)
                                           else len(c.plain) if isinstance(c, Text) else len(str(c))
                                           for c in (r[i] for r in rows)]) + 2
    widths = [need(i) for i in range(len(columns))]
    keys = [key for _, key in columns]
    chosen = [i for i, key in enumerate(keys) if key not in priority]
    used = sum(widths[i] for i in chosen)
    for key in priority:
        i = keys.index(key)
        if used + widths[i] <= width:
            chosen.append(i)
            used += widths[i]
    return sorted(chosen)


class StepRuler(Widget):
    """One line under the plot: a tick where each step ended, the time span at the ends."""

    DEFAULT_CSS = "StepRuler { height: 1; }"

    marks: reactive[tuple[StepMark, ...]] = reactive(tuple)
    span: reactive[tuple[float, float]] = reactive((0.0, 0.0))

    def render(self) -> Text:
        width = self.size.width
        if width <= 0:
            return Text()
        t0, t1 = self.span
        cells = [" "] * width
        if t1 > t0:
            for m in self.marks:
                if t0 <= m.end <= t1:
                    cells[min(int((m.end - t0) / (t1 - t0) * width), width - 1)] = "╵"
        left, right_ = f"{t0:.1f}s ", f" {t1:.1f}s"
        text = Text("".join(cells), style="dim")
        if len(left) + len(right_) < width:
            text = Text(left, style="dim") + text[len(left):width - len(right_)] + Text(right_, style="dim")
        return text


class SelectionChanged(Message):
    """A view changed what it wants read (a step, a depth...): the app reads again."""

    def __init__(self, **changes: Any) -> None:
        super().__init__()
        self.changes = changes
