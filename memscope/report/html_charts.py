"""The HTML page's charts: inline SVG that follows the window's width, from the timeline model.

A chart is a grid: the memory-unit labels of the y axis (HTML, left), the plot (an SVG whose
``viewBox`` is stretched to the column's width: ``preserveAspectRatio="none"`` with strokes that
do not scale), the x labels (HTML, placed in percent of the width). So a chart is as wide as the
window at 1,400 px and at 600 px, and its text stays 11 px. Each column of the plot carries a
``data-tip`` (step, time, every series' or category's bytes): the page's few lines of script show
it beside the pointer (as text, never markup); without script the chart still draws.

Nothing here computes what is drawn: the points come from memscope.analysis.run_timeline.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Sequence

from memscope.analysis.axes import byte_ticks, number_ticks
from memscope.analysis.categories import CategoryTimeline, LeakGrowth
from memscope.analysis.run_timeline import Mark
from memscope.analysis.timeline import StepMark
from memscope.display import shown_text
from memscope.units import axis_bytes, human_bytes

VIEW_W = 1000  # the plot's own x units; stretched to the column's width
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
CATEGORY_COLORS = {"parameters": "#1f77b4", "gradients": "#ff7f0e", "optimizer_state": "#2ca02c",
                   "activations": "#9467bd", "other": "#c7c7c7"}
LEAK_COLORS = ["#d62728", "#ff9896", "#ad494a", "#e7969c"]
OOM_COLOR = "#d62728"
PEAK_COLOR = "#ffdd57"
MARK_COLORS = {"oom": OOM_COLOR, "evaluation": "#17becf", "attached": "#2ca02c", "detached": "#8c564b"}
MAX_STEP_BANDS = 400  # more step spans than this would be a grey smear: not drawn


def esc(v: Any) -> str:
    """Any text on the page: shown through memscope.display, then HTML-escaped."""
    return html.escape("-" if v is None else shown_text(v), quote=True)


def tip_text(tip: str) -> str:
    """A tooltip's lines for a ``data-tip`` attribute: each line shown and escaped (a newline in
    the data stays ``\\n``), joined by newline entities the tooltip keeps (white-space: pre-line)."""
    return "&#10;".join(esc(line) for line in tip.split("\n"))


def part_color(key: str) -> str:
    if key.startswith("leak:"):
        return LEAK_COLORS[int(key[5:]) % len(LEAK_COLORS)]
    return CATEGORY_COLORS.get(key, "#7f7f7f")


@dataclass
class Chart:
    """One chart in plot units: x in [x_lo, x_hi] -> [0, VIEW_W]; y in [0, y_top] -> [height, 0]."""

    id: str
    height: int
    x_lo: float
    x_hi: float
    y_top: float
    x_unit: str                                       # "s" (seconds) or "step"
    body: list[str] = field(default_factory=list)     # SVG elements, in plot units
    hits: list[tuple[float, float, str]] = field(default_factory=list)  # (x0, x1, tip text)
    flags: list[tuple[float, str, str]] = field(default_factory=list)   # (x, label, colour) over the plot

    def x(self, v: float) -> float:
        span = self.x_hi - self.x_lo
        return (v - self.x_lo) / span * VIEW_W if span > 0 else VIEW_W / 2

    def y(self, v: float) -> float:
        return self.height - (v / self.y_top * self.height if self.y_top > 0 else 0.0)


def render(chart: Chart, aria: str, empty: str | None = None) -> str:
    """The chart's HTML: y labels, the stretched SVG plot with its hit columns, x labels."""
    if empty is not None:
        return (f'<figure class="chart" id="{chart.id}"><p class="none">{esc(empty)}</p></figure>')
    h = chart.height
    ylabels = "".join(f'<span style="top:{chart.y(v):.1f}px">{esc(axis_bytes(v))}</span>'
                      for v in byte_ticks(chart.y_top)[1] if v <= chart.y_top + 1e-9)
    integer = chart.x_unit == "step"
    xlabels = "".join(
        f'<span style="left:{chart.x(v) / VIEW_W * 100:.2f}%">{esc(_x_label(v, chart.x_unit))}</span>'
        for v in number_ticks(chart.x_lo, chart.x_hi, 8, integer))
    grid = "".join(f'<line class="grid" x1="0" x2="{VIEW_W}" y1="{chart.y(v):.2f}" y2="{chart.y(v):.2f}"/>'
                   for v in byte_ticks(chart.y_top)[1])
    hits = "".join(f'<rect class="hit" x="{x0:.2f}" y="0" width="{max(x1 - x0, 0.5):.2f}" height="{h}" '
                   f'data-tip="{tip_text(tip)}"/>' for x0, x1, tip in chart.hits)
    flags = "".join(f'<span class="flag{" end" if chart.x(x) > 0.8 * VIEW_W else ""}" '
                    f'style="left:{chart.x(x) / VIEW_W * 100:.2f}%;color:{color}">{esc(label)}</span>'
                    for x, label, color in chart.flags)  # near the right edge: to the left of its line
    return (f'<figure class="chart" id="{chart.id}"><div class="ylab">{ylabels}</div>'
            f'<div class="plotbox"><svg class="plot" role="img" aria-label="{esc(aria)}" '
            f'viewBox="0 0 {VIEW_W} {h}" preserveAspectRatio="none" height="{h}">'
            f'<rect class="frame" x="0" y="0" width="{VIEW_W}" height="{h}"/>{grid}'
            + "".join(chart.body) + hits + f'</svg>{flags}<div class="xlab">{xlabels}</div></div></figure>')


def _x_label(v: float, unit: str) -> str:
    return f"step {v:g}" if unit == "step" and v == 0 else f"{v:g}" if unit == "step" else f"{v:g} s"


# -- memory over time --------------------------------------------------------------------------


@dataclass
class Line:
    label: str
    points: list[tuple[float, int]]  # (seconds since run start, bytes)
    color: str
    dashed: bool = False


def timeline_chart(lines: Sequence[Line], steps: Sequence[StepMark], marks: Sequence[Mark],
                   categories: CategoryTimeline | None, height: int = 260) -> tuple[str, list[tuple[str, str]]]:
    """Memory over time: one line per series, alternate step bands, the peak step, OOMs,
    evaluations, attach and detach. Returns the chart's HTML and its legend (label, colour)."""
    pts = [pt for ln in lines for pt in ln.points]
    legend = [(ln.label, ln.color) for ln in lines]
    if not pts:
        return render(Chart("timeline", height, 0, 1, 1, "s"), "", "no memory samples in this run"), legend
    t_lo = min(t for t, _ in pts)
    t_hi = max([t for t, _ in pts] + [m.t for m in marks if m.kind != "peak"])
    if t_hi <= t_lo:
        t_hi = t_lo + 1.0
    top, _ = byte_ticks(max(v for _, v in pts))
    c = Chart("timeline", height, t_lo, t_hi, top, "s")
    if len(steps) <= MAX_STEP_BANDS:
        for i, s in enumerate(steps):
            if i % 2 == 0 and s.end >= t_lo and s.start <= t_hi:
                xa, xb = c.x(max(s.start, t_lo)), c.x(min(s.end, t_hi))
                c.body.append(f'<rect class="step" x="{xa:.2f}" y="0" width="{max(xb - xa, 0.3):.2f}" '
                              f'height="{height}"/>')
        if steps:
            legend.append(("steps (alternate bands)", "#eef1f6"))
    for m in marks:
        if m.kind == "peak" and m.end is not None:
            xa, xb = c.x(m.t), c.x(m.end)
            c.body.append(f'<rect class="peak" x="{xa:.2f}" y="0" width="{max(xb - xa, 1.5):.2f}" height="{height}"/>')
            legend.append(("peak step", PEAK_COLOR))
    for ln in lines:
        coords = " ".join(f"{c.x(t):.2f},{c.y(v):.2f}" for t, v in ln.points)
        dash = ' stroke-dasharray="6 3"' if ln.dashed else ""
        c.body.append(f'<polyline class="series" stroke="{ln.color}"{dash} points="{coords}">'
                      f"<title>{esc(ln.label)}</title></polyline>")
    _event_marks(c, marks, legend)
    # a hit column per distinct sample time of the first series: time, step, every series, categories
    ref = lines[0].points if lines else []
    for i, (t, _) in enumerate(ref):
        a = (t + ref[i - 1][0]) / 2 if i else t_lo
        z = (t + ref[i + 1][0]) / 2 if i + 1 < len(ref) else t_hi
        c.hits.append((c.x(a), c.x(z), _time_tip(t, lines, steps, categories)))
    return render(c, "memory over time"), legend


def _event_marks(c: Chart, marks: Sequence[Mark], legend: list[tuple[str, str]]) -> None:
    seen: set[str] = set()
    for m in marks:
        if m.kind == "peak":
            continue
        color = MARK_COLORS.get(m.kind, "#555")
        x = c.x(m.t)
        width = 2 if m.kind == "oom" else 1.5
        if m.end is not None and m.end > m.t:  # a span: an evaluation that said when it ended
            c.body.append(f'<rect class="mark {m.kind}" x="{x:.2f}" y="0" width="{c.x(m.end) - x:.2f}" '
                          f'height="{c.height}" fill="{color}" fill-opacity="0.15"/>')
        c.body.append(f'<line class="mark {m.kind}" x1="{x:.2f}" x2="{x:.2f}" y1="0" y2="{c.height}" '
                      f'stroke="{color}" stroke-width="{width}"><title>{esc(m.label)}</title></line>')
        if m.kind not in seen:
            seen.add(m.kind)
            word = {"oom": "OOM", "evaluation": "eval", "attached": "attached", "detached": "detached"}[m.kind]
            c.flags.append((m.t, word, color))
            legend.append(({"oom": "out of memory", "evaluation": "evaluation",
                            "attached": "memscope attached", "detached": "memscope detached"}[m.kind], color))


def _time_tip(t: float, lines: Sequence[Line], steps: Sequence[StepMark],
              categories: CategoryTimeline | None) -> str:
    step = next((s.step for s in steps if s.start <= t <= s.end), None)
    out = [f"{t:.2f} s" + (f" · step {step}" if step is not None else "")]
    for ln in lines:
        v = _at(ln.points, t)
        if v is not None:
            out.append(f"{ln.label}: {human_bytes(v)}")
    if categories is not None:
        before = [p for p in categories.points if p.t is not None and p.t <= t + 1e-9]
        if before:
            p = before[-1]
            out.append(f"tensors at the end of step {p.step}:" if p.at == "end"
                       else f"at the peak of profiled step {p.step}:")
            out += [f"  {_part_label(categories, k)}: {human_bytes(v)}" for k, v in p.parts.items() if k != "other"]
    return "\n".join(out)


def _at(points: Sequence[tuple[float, int]], t: float) -> int | None:
    """The value of the point at ``t`` or the last one before it."""
    best = None
    for pt, v in points:
        if pt > t + 1e-9:
            break
        best = v
    return best


def _part_label(cats: CategoryTimeline, key: str) -> str:
    """A part's short name for a tooltip: a leak is "leak N" (its group is in the legend)."""
    return f"leak {int(key[5:]) + 1}" if key.startswith("leak:") else cats.labels.get(key, key)


# -- memory by category over the steps ---------------------------------------------------------


def category_chart(cats: CategoryTimeline, height: int = 220) -> tuple[str, list[tuple[str, str]]]:
    """Stacked bars, one per category point, in stack order; a column's tip has the step, its
    time, every part and ``other`` (with the metric)."""
    legend = [(_legend_label(cats, k), part_color(k)) for k in cats.stack]
    pts = cats.points
    if not pts:
        return render(Chart("categories", height, 0, 1, 1, "step"), "",
                      "no tensor inventory or profiled step in this run"), legend
    totals = [sum(p.parts.get(k, 0) for k in cats.stack) for p in pts]
    top, _ = byte_ticks(max(totals) if max(totals) > 0 else 1)
    lo, hi = pts[0].step, pts[-1].step
    pad = 0.5 if hi > lo else 1.0
    c = Chart("categories", height, lo - pad, hi + pad, top, "step")
    for i, p in enumerate(pts):
        gaps = [abs(p.step - q.step) for q in (pts[i - 1] if i else None, pts[i + 1] if i + 1 < len(pts) else None)
                if q is not None]
        half = min(min(gaps, default=1.0) * 0.4, (hi - lo + 2 * pad) * 0.03)
        xa, xb = c.x(p.step - half), c.x(p.step + half)
        base = 0
        for k in cats.stack:
            v = p.parts.get(k, 0)
            if v > 0:
                c.body.append(f'<rect class="part" data-part="{esc(k)}" x="{xa:.2f}" y="{c.y(base + v):.2f}" '
                              f'width="{max(xb - xa, 0.5):.2f}" height="{c.y(base) - c.y(base + v):.2f}" '
                              f'fill="{part_color(k)}"/>')
            base += v
        ha = c.x(p.step - (p.step - pts[i - 1].step) / 2) if i else 0.0
        hb = c.x(p.step + (pts[i + 1].step - p.step) / 2) if i + 1 < len(pts) else float(VIEW_W)
        c.hits.append((ha, hb, _category_tip(cats, p)))
    return render(c, "memory by category over the steps"), legend


def _legend_label(cats: CategoryTimeline, key: str) -> str:
    label = cats.labels.get(key, key)
    return f"leak {int(key[5:]) + 1}: {label.removeprefix('leak: ')}" if key.startswith("leak:") else label


def _category_tip(cats: CategoryTimeline, p: Any) -> str:
    when = f" ({p.t:.2f} s)" if p.t is not None else ""
    head = (f"step {p.step}{when}, at its end" if p.at == "end" else f"step {p.step}{when}, at its peak")
    lines = [head] + [f"{_part_label(cats, k)}: {human_bytes(v)}" for k, v in p.parts.items() if k != "other"]
    lines.append(f"other: {human_bytes(p.parts.get('other', 0))}"
                 + (f" (of {cats.metric_label} {human_bytes(p.metric)})" if p.metric is not None else ""))
    return "\n".join(lines)


# -- a leak's growth ---------------------------------------------------------------------------


def leak_chart(g: LeakGrowth, index: int, height: int = 160) -> str:
    """The group's bytes at each inventory (a line through the points) and the verdict's rate
    (dashed, over the steps it grew in)."""
    color = LEAK_COLORS[index % len(LEAK_COLORS)]
    cid = f"leak-{index + 1}"
    if not g.points:
        return render(Chart(cid, height, 0, 1, 1, "step"), "", "no inventory holds this group")
    values = [v for _, v in g.points] + ([g.fit[1][1], g.fit[0][1]] if g.fit else [])
    top, _ = byte_ticks(max(values))
    lo, hi = g.points[0][0], g.points[-1][0]
    c = Chart(cid, height, lo, hi if hi > lo else lo + 1, top, "step")
    coords = " ".join(f"{c.x(s):.2f},{c.y(v):.2f}" for s, v in g.points)
    c.body.append(f'<polyline class="series leak" stroke="{color}" points="{coords}"/>')
    if g.fit is not None:
        (s0, v0), (s1, v1) = g.fit
        c.body.append(f'<line class="fit" x1="{c.x(s0):.2f}" y1="{c.y(v0):.2f}" x2="{c.x(s1):.2f}" '
                      f'y2="{c.y(v1):.2f}" stroke="#333" stroke-dasharray="5 4"/>')
    rate = human_bytes(g.leak.bytes_per_step)
    for i, (s, v) in enumerate(g.points):
        a = c.x((s + g.points[i - 1][0]) / 2) if i else 0.0
        z = c.x((s + g.points[i + 1][0]) / 2) if i + 1 < len(g.points) else float(VIEW_W)
        fit = ""
        if g.fit is not None and g.fit[0][0] <= s <= g.fit[1][0]:
            fit = f"\nverdict: {human_bytes(g.fit[0][1] + g.leak.bytes_per_step * (s - g.fit[0][0]))} (+{rate}/step)"
        c.hits.append((a, z, f"step {s}\nleak {index + 1}: {human_bytes(v)}{fit}"))
    return render(c, f"leak {index + 1} over the steps")
