"""1 · Overview: what ran, its state, memory over time, the last steps."""

from __future__ import annotations

import shlex
import time
from typing import Any, Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Sparkline, Static

from memscope.analysis.summary import RunSummary
from memscope.analysis.timeline import METRIC_LABELS, Series, StepRow
from memscope.display import shown, shown_text
from memscope.units import human_bytes
from memscope_tui.data import BUCKETS, Snapshot
from memscope_tui.views import View, matches
from memscope_tui.widgets import StepRuler, fill_table, right

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
        yield Sparkline([], id="timeline")
        yield StepRuler(id="ruler")
        yield DataTable(id="steps", cursor_type="row", zebra_stripes=True)

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
        """Switch the plot to the next metric; returns why not when there is no other."""
        names = list(all_series(snap))
        if len(names) < 2:
            return "only one memory metric in this run" if names else _no_samples(snap)
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
        spark = self.query_one("#timeline", Sparkline)
        ruler = self.query_one("#ruler", StepRuler)
        if series is None or not series.points:
            caption.update(_no_samples(snap))
            spark.data = []
            ruler.marks, ruler.span = (), (0.0, 0.0)
            return
        line = Text.assemble((shown(series.label), "bold"),
                             f" · high {human_bytes(series.max)} · low {human_bytes(series.min)}"
                             f" · now {human_bytes(series.last)}")
        hint = " · m: next metric" if len(series_by) > 1 else ""
        if line.cell_len + len(hint) <= self.text_width():  # the hint goes first (it is in ? help)
            line.append(hint, style="dim")
        caption.update(line)
        spark.data = series.on_grid(BUCKETS, tl.t0, tl.t1)
        ruler.marks = tuple(tl.steps)
        ruler.span = (tl.t0, tl.t1)

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


def _no_samples(snap: Snapshot) -> str:
    """Why the plot is empty: a live run has not sampled yet; a finished one never did."""
    if snap.summary.status == "running":
        return "no memory samples yet"
    return "no memory samples in this run"
