"""Small widgets and text helpers shared by the views (drawing only, no analysis)."""

from __future__ import annotations

import re
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import DataTable

from memscope.analysis.timeline import StepMark
from memscope.display import NAME_LIMIT, middle, shown

BAR_CELLS = 10


def bar(share: float, width: int = BAR_CELLS) -> Text:
    """A share in [0, 1] as a bar of ``width`` cells (eighth blocks), readable in any theme."""
    share = min(max(share, 0.0), 1.0)
    eighths = round(share * width * 8)
    full, rest = divmod(eighths, 8)
    body = "█" * full + ("▏▎▍▌▋▊▉"[rest - 1] if rest else "")
    return Text(body.ljust(width))  # no fixed colour: the theme's text colour reads on light and dark


class RowTable(DataTable[Any]):
    """A table of rows (the row cursor): home and end go to the first and last row, as ^home and
    ^end do and as the help (?) says; in a plain DataTable they scroll sideways."""

    BINDINGS = [
        Binding("home", "scroll_top", "First row", show=False),
        Binding("end", "scroll_bottom", "Last row", show=False),
    ]


_WORD = re.compile(r"\S+\s*")
_ENDS_IN_NUMBER = re.compile(r".*\d\s+")
_UNIT = re.compile(r"(?:[KMGTPE]i?B|B|bytes|ms|s)(?:[^\w]|$)")


def _breaks(line: str, width: int) -> list[int]:
    """Where to break one line into lines of ``width`` cells: at spaces, never between a number
    and its unit (``82.50 KiB``; Textual and rich both break at any space)."""
    words: list[tuple[int, int]] = []
    for m in _WORD.finditer(line):
        if words and _ENDS_IN_NUMBER.fullmatch(line, words[-1][0], words[-1][1]) and _UNIT.match(m.group()):
            words[-1] = (words[-1][0], m.end())  # "82.50 " + "KiB": one word
        else:
            words.append((m.start(), m.end()))
    breaks, used = [], 0
    for start, end in words:
        need = cell_len(line[start:end].rstrip())
        if used and used + need > width:
            breaks.append(start)
            used = 0
        used += cell_len(line[start:end])
    return breaks


def keep_figures(text: Text, width: int) -> Text:
    """``text`` wrapped to ``width`` cells by us, so that no figure is split from its unit when
    the widget wraps it (it then has nothing left to wrap)."""
    if width < 8:
        return text
    out: list[Text] = []
    for line in text.split("\n", allow_blank=True):
        for part in line.divide(_breaks(line.plain, width)):
            part.rstrip()
            out.append(part)
    return Text("\n").join(out)


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
    # Each column gets its width now, measured here: DataTable measures new cells only when idle,
    # and a frame drawn before that stays cached at the old (label's) width, a figure cut to
    # "364.09 M" for good (Textual 8.2's cell cache has no width in its key).
    widths = tuple(max([cell_len(label)] + [cell_len(cell_text(cells[i])) for _, cells in rows if i < len(cells)])
                   for i, (label, _) in enumerate(columns))
    layout = (tuple(columns), widths)
    if state.get(name + ":columns") != layout:
        table.clear(columns=True)
        for (label, col_key), width in zip(columns, widths):
            table.add_column(label, key=col_key, width=width)
        state[name + ":columns"] = layout
    else:
        table.clear()
    for row_key, cells in rows:
        # a str cell would be parsed as markup by the table: data is drawn as plain text only
        table.add_row(*(plain(c) if isinstance(c, str) else c for c in cells), key=row_key)
    state[name] = key
    if rows:
        table.move_cursor(row=min(max(cursor, 0), len(rows) - 1))


def cell_text(cell: object) -> str:
    """What a table cell draws, as plain text."""
    return shown(cell) if isinstance(cell, str) else cell.plain if isinstance(cell, Text) else str(cell)


def fit_columns(columns: list[tuple[str, str]], rows: list[list[Any]], width: int,
                priority: list[str], shrink: dict[str, int] | None = None) -> tuple[list[int], dict[int, int]]:
    """Which columns to show in ``width`` cells, and how narrow the shortened ones are.

    Every column when they fit. Else the columns not in ``priority`` (always shown), those of
    ``shrink`` (key -> fewest cells, e.g. a module name) at their fewest, plus as many of
    ``priority`` (most wanted first) as fit; the room left widens the shrunk columns again. A
    column is never cut by the edge of the table: it is shown whole or left out, so a number is
    never cut mid-figure. A DataTable cell is its widest value plus one cell of padding each side.
    Returns the shown column indices and {index: cells} for the columns to shorten
    (:func:`shorten_cells`)."""
    shrink = shrink or {}
    keys = [key for _, key in columns]
    full = [max([cell_len(columns[i][0])] + [cell_len(cell_text(r[i])) for r in rows]) + 2
            for i in range(len(columns))]
    if sum(full) <= width:
        return list(range(len(columns))), {}
    least = {i: min(full[i], max(shrink[key], len(columns[i][0])) + 2)
             for i, key in enumerate(keys) if key in shrink}
    chosen = [i for i, key in enumerate(keys) if key not in priority]
    used = sum(least.get(i, full[i]) for i in chosen)
    for key in priority:
        i = keys.index(key)
        if used + full[i] <= width:
            chosen.append(i)
            used += full[i]
    room = max(width - used, 0)
    narrow: dict[int, int] = {}
    for i in sorted(chosen):
        if i in least:
            grow = min(full[i] - least[i], room)
            room -= grow
            if least[i] + grow < full[i]:
                narrow[i] = least[i] + grow - 2
    return sorted(chosen), narrow


def shorten_cells(cells: list[Any], narrow: dict[int, int]) -> list[Any]:
    """``cells`` with those of the ``narrow`` columns shortened from the middle to fit."""
    out = list(cells)
    for i, cells_wide in narrow.items():
        cell = out[i]
        text = cell_text(cell)
        if cell_len(text) > cells_wide:
            style = cell.style if isinstance(cell, Text) else ""
            justify = cell.justify if isinstance(cell, Text) else None
            short = middle(text, cells_wide)
            for fewer in range(cells_wide - 1, 0, -1):  # wide characters (中文) take two cells
                if cell_len(short) <= cells_wide:
                    break
                short = middle(text, fewer)
            out[i] = Text(short, style=style, justify=justify)
    return out


def table_room(table: DataTable[Any], fallback: int = 80) -> int:
    """Cells a table's columns may use: its width less a vertical scrollbar's (kept free always,
    so a table that grows a scrollbar does not push its last column off the edge)."""
    return (table.size.width or fallback) - table.styles.scrollbar_size_vertical


def state_line(parts: list[tuple[str, str]], width: int, squeeze: int | None = None) -> str:
    """The status line's parts, each (long, short), joined with `` · `` in ``width`` cells: the
    long forms when they fit, else short forms from the last part back; then part ``squeeze``
    (free text: a filter) is shortened from the middle. Figures are never cut."""
    texts = [long for long, _ in parts]
    for i in reversed(range(len(parts))):
        if len(" · ".join(texts)) <= width:
            break
        texts[i] = parts[i][1]
    over = len(" · ".join(texts)) - width
    if over > 0 and squeeze is not None:
        texts[squeeze] = middle(texts[squeeze], max(len(texts[squeeze]) - over, 8))
    return " · ".join(texts)


class StepRuler(Widget):
    """One line under the plot, aligned with its area (``indent`` cells from the left): a tick
    where each step ended within ``span``."""

    DEFAULT_CSS = "StepRuler { height: 1; }"

    marks: reactive[tuple[StepMark, ...]] = reactive(tuple)
    span: reactive[tuple[float, float]] = reactive((0.0, 0.0))
    indent: reactive[int] = reactive(0)

    def render(self) -> Text:
        width = self.size.width - self.indent
        if width <= 0:
            return Text()
        t0, t1 = self.span
        cells = [" "] * width
        if t1 > t0:
            for m in self.marks:
                if t0 <= m.end <= t1:
                    cells[min(int((m.end - t0) / (t1 - t0) * width), width - 1)] = "╵"
        lead = "steps".rjust(self.indent - 1)[:max(self.indent - 1, 0)] + " " if self.indent > 1 else ""
        return Text(lead + "".join(cells), style="dim")


class SelectionChanged(Message):
    """A view changed what it wants read (a step, a depth...): the app reads again."""

    def __init__(self, **changes: Any) -> None:
        super().__init__()
        self.changes = changes
