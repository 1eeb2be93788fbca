"""A plot drawn with Textual's own means: memory-unit y labels, a step or time x axis, several
series with a legend, stacked bars, marks; as large as the space the layout gives it.

Lines are braille dots (2 x 4 per cell, so a 72-cell plot has 144 points across), stacked bars
are blocks with eighth-block tops, marks are columns. Colours are the terminal's named colours
(the dashboard's themes map them, light and dark). The scale comes from memscope.analysis.axes
(the HTML page's charts use the same), from zero: a 5% rise looks like 5%.

    plot.figure = Figure("s", lines=[Curve("host RSS", [(0.0, 3.1e8), (2.5, 3.4e8)], "cyan")])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from memscope.analysis.axes import byte_ticks, number_ticks
from memscope.units import axis_bytes

# braille dot bits, by (column 0-1, row 0-3) within a cell
_DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
_EIGHTHS = " ▁▂▃▄▅▆▇█"
Scale = Callable[[float], float]  # a value to cells (x: from the left, y: from the bottom)


@dataclass(frozen=True)
class Curve:
    """A series drawn as a line through its points ((x, bytes), x increasing)."""

    label: str
    points: Sequence[tuple[float, float]]
    color: str
    dashed: bool = False


@dataclass(frozen=True)
class Bars:
    """Stacked bars: at each x, the parts' values stacked bottom first."""

    xs: Sequence[float]
    parts: Sequence[tuple[str, str, Sequence[float]]]  # (label, colour, one value per x)


@dataclass(frozen=True)
class Mark:
    """A moment: a column at ``x`` (a span to ``end``), in its colour, named in the legend."""

    x: float
    label: str
    color: str
    end: float | None = None


@dataclass(frozen=True)
class Figure:
    x_unit: str                                         # "s" or "step"
    lines: Sequence[Curve] = ()
    bars: Bars | None = None
    marks: Sequence[Mark] = ()
    empty: str = "nothing to plot"                      # said when there are no points
    legend_extra: Sequence[tuple[str, str]] = ()        # (label, colour) keys besides the series'
    x_range: tuple[float, float] | None = None

    def has_points(self) -> bool:
        return any(c.points for c in self.lines) or bool(self.bars and self.bars.xs)


@dataclass
class _Canvas:
    width: int
    height: int
    dots: list[list[int]] = field(default_factory=list)
    ink: list[list[str | None]] = field(default_factory=list)   # a cell's dot colour
    cells: list[list[tuple[str, str] | None]] = field(default_factory=list)  # a block or mark

    def __post_init__(self) -> None:
        self.dots = [[0] * self.width for _ in range(self.height)]
        self.ink = [[None] * self.width for _ in range(self.height)]
        self.cells = [[None] * self.width for _ in range(self.height)]

    def dot(self, x: int, y: int, color: str) -> None:
        """Dot ``x`` of 2 x width, ``y`` of 4 x height (0 at the top)."""
        cx, cy = x // 2, y // 4
        if 0 <= cx < self.width and 0 <= cy < self.height and x >= 0 and y >= 0:
            self.dots[cy][cx] |= _DOTS[x % 2][y % 4]
            self.ink[cy][cx] = color


class Plot(Widget):
    """Draws a :class:`Figure` in its whole size: a legend line, the plot, the x axis and labels."""

    DEFAULT_CSS = "Plot { height: 1fr; min-height: 6; }"

    figure: reactive[Figure | None] = reactive(None)

    def render(self) -> Text:
        return render_figure(self.figure, self.size.width, self.size.height)


def figure_left(fig: Figure) -> int:
    """Cells left of the plot area (the y labels and the axis): where a line drawn under the plot
    (the dashboard's step ruler) starts, to align with it."""
    return max(cell_len(axis_bytes(v)) for v in byte_ticks(_y_max(fig))[1]) + 2


def _y_max(fig: Figure) -> float:
    ys = [y for c in fig.lines for _, y in c.points]
    if fig.bars:
        ys += [sum(p[2][i] for p in fig.bars.parts) for i in range(len(fig.bars.xs))]
    return max(ys, default=0.0)


def render_figure(fig: Figure | None, width: int, height: int) -> Text:
    """The figure as ``height`` lines of ``width`` cells (fewer when there is no room)."""
    if fig is None or width < 12 or height < 4:
        return Text()
    if not fig.has_points():
        return Text(fig.empty, style="dim")
    xs = [x for c in fig.lines for x, _ in c.points] + list(fig.bars.xs if fig.bars else [])
    x_lo, x_hi = fig.x_range or (min(xs), max(xs))
    if fig.bars is not None and fig.x_range is None:  # room for the first and the last bar
        x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
    if x_hi <= x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    top, ticks = byte_ticks(_y_max(fig))
    labels = [axis_bytes(v) for v in ticks]
    label_w = max(cell_len(s) for s in labels)
    plot_w = width - label_w - 2
    plot_h = height - 3                                # the legend, the axis line, the x labels
    if plot_w < 8 or plot_h < 1:
        return Text(fig.empty, style="dim")
    canvas = _Canvas(plot_w, plot_h)

    def col(x: float) -> float:  # 0 .. plot_w (cells)
        return (x - x_lo) / (x_hi - x_lo) * plot_w

    def level(v: float) -> float:  # 0 .. plot_h (cells from the bottom)
        return max(0.0, v) / top * plot_h

    _draw_marks(canvas, fig.marks, col)
    if fig.bars is not None:
        _draw_bars(canvas, fig.bars, col, level)
    for curve in fig.lines:
        _draw_curve(canvas, curve, col, level)

    lines = [_legend(fig, width)]
    tick_rows: dict[int, str] = {}
    for v, s in zip(ticks, labels):
        row = plot_h - 1 - min(int(level(v)), plot_h - 1) if v < top else 0
        if v == 0:
            row = plot_h - 1
        tick_rows.setdefault(row, s)
    for r in range(plot_h):
        line = Text()
        line.append(tick_rows.get(r, "").rjust(label_w) + (" ┤" if r in tick_rows else " │"), style="dim")
        for c in range(plot_w):
            bits, block = canvas.dots[r][c], canvas.cells[r][c]
            if bits:
                line.append(chr(0x2800 + bits), style=canvas.ink[r][c] or "")
            elif block is not None:
                line.append(block[0], style=block[1])
            else:
                line.append(" ")
        lines.append(line)
    lines += _x_axis(fig.x_unit, x_lo, x_hi, plot_w, label_w, col)
    return Text("\n").join(lines)


def _draw_curve(canvas: _Canvas, curve: Curve, col: Scale, level: Scale) -> None:
    pts = [(int(round(col(x) * 2)), int(round((canvas.height - level(y)) * 4))) for x, y in curve.points]
    pts = [(min(max(px, 0), canvas.width * 2 - 1), min(max(py, 0), canvas.height * 4 - 1)) for px, py in pts]
    n = 0
    if len(pts) == 1:
        canvas.dot(pts[0][0], pts[0][1], curve.color)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for i in range(steps + 1):
            n += 1
            if curve.dashed and n % 6 >= 3:
                continue
            canvas.dot(x0 + round((x1 - x0) * i / steps), y0 + round((y1 - y0) * i / steps), curve.color)


def _draw_bars(canvas: _Canvas, bars: Bars, col: Scale, level: Scale) -> None:
    """Each cell of a bar is the part covering most of it; the stack's top cell, partly covered,
    an eighth block of its height."""
    centers = [col(x) for x in bars.xs]
    gaps = [b - a for a, b in zip(centers, centers[1:])]
    width = max(1, min(4, int(min(gaps, default=4.0) * 0.6)))
    for i, c in enumerate(centers):
        first = min(max(int(c - width / 2 + 0.5), 0), canvas.width - width)
        spans, base = [], 0.0
        for _label, color, values in bars.parts:
            v = max(values[i], 0.0)
            spans.append((level(base), level(base + v), color))
            base += v
        for r in range(canvas.height):
            cell_lo = canvas.height - r - 1  # the cell spans [cell_lo, cell_lo + 1) from the bottom
            covers = [(min(hi, cell_lo + 1) - max(lo, cell_lo), color) for lo, hi, color in spans]
            filled = sum(c for c, _ in covers if c > 0)
            if filled <= 1 / 16:
                continue
            color = max((cv for cv in covers if cv[0] > 0), key=lambda cv: cv[0])[1]
            glyph = "█" if filled >= 15 / 16 else _EIGHTHS[max(1, round(filled * 8))]
            for x in range(first, first + width):
                canvas.cells[r][x] = (glyph, color)


def _draw_marks(canvas: _Canvas, marks: Sequence[Mark], col: Scale) -> None:
    for m in marks:
        a = int(col(m.x))
        z = int(col(m.end)) if m.end is not None else a
        for x in range(max(a, 0), min(max(z, a), canvas.width - 1) + 1):
            glyph = "┃" if m.end is None else "░"
            for r in range(canvas.height):
                canvas.cells[r][x] = (glyph, m.color)


def _legend(fig: Figure, width: int) -> Text:
    keys: list[tuple[str, str, str]] = []
    if fig.bars is not None:
        keys += [("█", color, label) for label, color, _ in fig.bars.parts]
    keys += [("┄" if c.dashed else "━", c.color, c.label) for c in fig.lines]
    seen = set()
    for m in fig.marks:
        if m.label not in seen:
            seen.add(m.label)
            keys.append(("░" if m.end is not None else "┃", m.color, m.label))
    keys += [("█", color, label) for label, color in fig.legend_extra]
    text = Text()
    for i, (glyph, color, label) in enumerate(keys):
        item = Text.assemble((glyph, color), " ", label)
        sep = 2 if i else 0
        if text.cell_len + sep + item.cell_len > width:
            rest = len(keys) - i
            more = f" +{rest}"
            if text.cell_len + len(more) <= width:
                text.append(more, style="dim")
            break
        text.append(" " * sep)
        text.append_text(item)
    return text


def _x_axis(unit: str, lo: float, hi: float, plot_w: int, label_w: int, col: Scale) -> list[Text]:
    ticks = number_ticks(lo, hi, max(2, plot_w // 12), integer=unit == "step")
    axis = [" "] * plot_w
    row = [" "] * (plot_w + label_w + 2)
    last_end = -1
    for v in ticks:
        c = int(col(v))
        if not 0 <= c < plot_w:
            continue
        axis[c] = "┬"
        text = f"{v:g}" + (" s" if unit == "s" else "")
        at = label_w + 2 + c - len(text) // 2
        at = max(at, last_end + 2, 0)
        if at + len(text) > len(row):
            at = len(row) - len(text)
            if at <= last_end + 1:
                continue
        row[at:at + len(text)] = list(text)
        last_end = at + len(text) - 1
    name = "step" if unit == "step" else ""
    lead = name.rjust(label_w) if name and not "".join(row[:label_w]).strip() else None
    if lead is not None:
        row[:label_w] = list(lead)
    base = Text()
    base.append(" " * label_w + " └" + "".join("─" if ch == " " else ch for ch in axis), style="dim")
    labels = Text()
    labels.append("".join(row), style="dim")
    return [base, labels]
