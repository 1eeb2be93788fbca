"""1 · Overview: what ran, its state, memory over time, the last steps."""

from __future__ import annotations

import shlex
import time
from typing import Any, Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from memscope.analysis.summary import RunSummary
from memscope.analysis.timeline import METRIC_LABELS, Series, StepRow
from memscope.display import shown, shown_text
from memscope.units import human_bytes
from memscope_tui.data import Snapshot
from memscope_tui.plot import Curve, Figure, Mark, Plot, figure_left
from memscope_tui.views import View, matches
from memscope_tui.widgets import RowTable, StepRuler, fill_table, right

SERIES_COLORS = ["cyan", "yellow", "green", "blue", "bright_black"]
TENSORS_COLOR = "magenta"
# the timeline model's marks: (legend word, colour)
MARK_STYLES = {"peak": ("peak step", "yellow"), "oom": ("OOM", "red"), "evaluation": ("evaluation", "cyan"),
               "attached": ("attached", "green"), "detached": ("detached", "bright_black")}
NO_DEVICE = ("a CPU run: host RSS is the only memory metric (CUDA allocated, reserved and NVML views "
             "need a run on a GPU); the plot also shows the tensors inventories counted")

_STATE_STYLE = {"live": "bold green", "finished": "green", "OOM": "bold red", "failed": "bold red",
                "killed": "bold yellow", "interrupted": "bold yellow", "abandoned": "bold yellow"}


def run_state(s: RunSummary) -> str:
    """live / finished / OOM / killed / interrupted / failed / abandoned: the header's word."""
    if s.status == "running":
        return "live"
    if s.oom is not None and s.oom.kind == "oom":
        return "OOM"
    return s.status


def status_text(s: RunSummary, now: Callable[[], float] = time.time) -> Text:
    state = run_state(s)
    text = Text()
    text.append(shown(state), style=_STATE_STYLE.get(state, "bold"))
    if s.signal is not None:
        text.append(f" (signal {s.signal})")
    elif s.exit_code is not None:
        text.append(f" (exit {s.exit_code})")
    if s.started is not None and (s.ended is not None or s.status == "running"):
        end = s.ended if s.ended is not None else now()
        text.append(f" · {end - s.started:.1f} s")
    elif s.status == "abandoned":
        text.append(" · no writer left")
    text.append(f" · {s.steps} steps · {s.samples} samples · ")
    text.append(f"{s.dropped} dropped", style="bold yellow" if s.dropped else "")
    return text


def device_text(s: RunSummary, pos: tuple[int | None, str | None]) -> Text:
    procs = len(s.processes)
    text = Text(f"{shown(s.device)} · torch {shown(s.torch or '?')}")
    if procs > 1:
        text.append(f" · {procs} processes")
    if s.median_step_s is not None:
        text.append(f" · median step {s.median_step_s * 1000:.0f} ms")
    if s.step_mode:
        text.append(f" · steps by {shown(s.step_mode)}")
    if s.status == "running" and pos[0] is not None:
        text.append(f" · now step {pos[0]}" + (f" {shown(pos[1])}" if pos[1] else ""), style="bold")
    return text


def peak_text(s: RunSummary) -> Text:
    text = Text("peak ")
    if s.peak.bytes is None:
        text.append("-")
        return text
    text.append(human_bytes(s.peak.bytes), style="bold")
    text.append(f" {shown(METRIC_LABELS.get(s.peak.metric, s.peak.metric))}")
    text.append(f" at step {s.peak.step}" if s.peak.step is not None else " outside any step")
    return text


def all_series(snap: Snapshot) -> dict[str, Series]:
    """The plot's metrics, primary first: CUDA allocated/reserved, host RSS, CUDA peak, NVML."""
    out = dict(snap.timeline.series)
    for series in snap.extra_series:
        out[series.metric] = series
    return out


class OverviewView(View):
    TITLE = "Overview"
    HINT = "m next memory metric · ↑↓ steps"

    def __init__(self, now: Callable[[], float] = time.time, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.now = now
        self.metric: str | None = None  # None: the primary series

    def compose(self) -> ComposeResult:
        with Vertical(id="run"):
            yield Static(id="command", classes="line", markup=False)
            yield Static(id="status", classes="line")
            yield Static(id="device", classes="line")
            yield Static(id="peak", classes="line")
        yield Static("reading run file…", id="caption", classes="line")
        yield Plot(id="timeline")
        yield StepRuler(id="ruler")
        yield RowTable(id="steps", cursor_type="row", zebra_stripes=True)

    def show(self, snap: Snapshot, filter_text: str) -> None:
        self.snap, self.filter_text = snap, filter_text
        s = snap.summary
        command = shown_text(shlex.join(s.command)) if s.command else "?"
        self.query_one("#command", Static).update(Text.assemble(("memscope ", "bold"), command))
        self.query_one("#status", Static).update(status_text(s, self.now))
        self.query_one("#device", Static).update(device_text(s, snap.position))
        self.query_one("#peak", Static).update(peak_text(s))
        self.show_timeline(snap)
        cuda = any(k.startswith("cuda") for k in snap.timeline.series)
        self._show_steps([r for r in snap.steps if matches(filter_text, r.step, r.status)], cuda)

    def next_metric(self, snap: Snapshot) -> str | None:
        """Put the next metric in front (the caption, drawn last); returns why not when there is
        no other."""
        names = list(all_series(snap))
        if len(names) < 2:
            if not names:
                return _no_samples(snap)
            return NO_DEVICE if snap.summary.device == "cpu" else "only one memory metric in this run"
        current = self.metric if self.metric in names else names[0]
        self.metric = names[(names.index(current) + 1) % len(names)]
        self.show_timeline(snap)
        return None

    def show_timeline(self, snap: Snapshot) -> None:
        tl = snap.timeline
        series_by = all_series(snap)
        series = series_by.get(self.metric) if self.metric else tl.primary
        if series is None:
            series = tl.primary
        caption = self.query_one("#caption", Static)
        plot = self.query_one("#timeline", Plot)
        ruler = self.query_one("#ruler", StepRuler)
        if series is None or not series.points:
            caption.update(_no_samples(snap))
            plot.figure = None
            ruler.marks, ruler.span = (), (0.0, 0.0)
            return
        line = Text.assemble((shown(series.label), "bold"),
                             f" · high {human_bytes(series.max)} · low {human_bytes(series.min)}"
                             f" · now {human_bytes(series.last)}")
        hint = " · m: next metric" if len(series_by) > 1 else ""
        if line.cell_len + len(hint) <= self.text_width():  # the hint goes first (it is in ? help)
            line.append(hint, style="dim")
        caption.update(line)
        figure = timeline_figure(snap, series.metric)
        plot.figure = figure
        ruler.marks = tuple(tl.steps)
        ruler.span = figure.x_range or (tl.t0, tl.t1)
        ruler.indent = figure_left(figure)  # under the plot's area (both have the same margin)

    def _show_steps(self, rows: list[StepRow], cuda: bool) -> None:
        columns = [("step", "step"), ("duration", "time"), ("peak RSS", "rss")]
        if cuda:
            columns += [("peak alloc", "alloc"), ("peak reserved", "reserved")]
        columns.append(("status", "status"))
        out: list[tuple[str, list[Any]]] = []
        for r in rows:
            cells: list[Any] = [right(str(r.step)), right(f"{r.duration_s * 1000:.0f} ms"),
                                right(human_bytes(r.peak_rss))]
            if cuda:
                cells += [right(human_bytes(r.peak_allocated)), right(human_bytes(r.peak_reserved))]
            cells.append(Text(shown(r.status), style="" if r.status == "ok" else "bold red"))
            out.append((str(r.step), cells))
        fill_table(self.query_one("#steps", DataTable), columns, out, self.drawn, "steps")


def timeline_figure(snap: Snapshot, focus: str | None = None) -> Figure:
    """Every memory metric over time (``focus`` drawn last, on top), the tensors the inventories
    counted, and the timeline's marks (the peak step, OOMs, evaluations, attach and detach)."""
    tl = snap.timeline
    curves = [Curve(shown(s.label), s.points, SERIES_COLORS[i % len(SERIES_COLORS)])
              for i, s in enumerate(all_series(snap).values())]
    focused = [c for c, metric in zip(curves, all_series(snap)) if metric == focus]
    curves = [c for c in curves if c not in focused] + focused
    cats = snap.categories
    if cats is not None and cats.points:
        tensors = [(p.t, float(p.tensors)) for p in cats.points if p.t is not None]
        if tensors:
            curves.insert(0, Curve("tensors" if cats.at == "end" else "tensors at peaks", tensors, TENSORS_COLOR))
    marks = [Mark(m.t, MARK_STYLES[m.kind][0], MARK_STYLES[m.kind][1], m.end)
             for m in snap.marks if m.kind in MARK_STYLES]
    hi = max([tl.t1] + [m.x for m in marks if m.end is None])
    return Figure("s", curves, marks=marks, x_range=(tl.t0, hi if hi > tl.t0 else tl.t0 + 1.0),
                  empty=_no_samples(snap))


def _no_samples(snap: Snapshot) -> str:
    """Why the plot is empty: a live run has not sampled yet; a finished one never did."""
    if snap.summary.status == "running":
        return "no memory samples yet"
    return "no memory samples in this run"
