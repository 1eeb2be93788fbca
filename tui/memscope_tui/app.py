"""The memscope dashboard: ``memscope tui RUN.db``.

Reads the run file only through :class:`memscope.store.reader.RunReader` and the pure functions
of :mod:`memscope.analysis`; every number on screen comes from there. A background thread
opens the reader, reads one :class:`Snapshot` and posts it to the app as a message; the UI
thread only draws. While the run is still being written (status ``running``) the snapshot is
re-read every :data:`POLL_S` seconds; once the run has ended, polling stops.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import DataTable, Footer, Sparkline, Static

from memscope.analysis.summary import RunSummary, summarize
from memscope.analysis.timeline import METRIC_LABELS, StepMark, StepRow, Timeline, memory_timeline, recent_steps
from memscope.report.format import human_bytes
from memscope.store.reader import RunReader

POLL_S = 0.5        # refresh period while the run is still being written
BUCKETS = 200       # timeline resolution read from the run file (the sparkline re-buckets to its width)
TABLE_STEPS = 50    # steps shown in the table, most recent first

_STATUS_STYLE = {"running": "bold green", "finished": "green", "failed": "bold red", "killed": "bold yellow"}


@dataclass(frozen=True)
class Snapshot:
    """Everything the overview shows, read in one go off the UI thread."""

    summary: RunSummary
    timeline: Timeline
    steps: list[StepRow]
    read_s: float  # how long the read took


def load_snapshot(db: str, buckets: int = BUCKETS, steps: int = TABLE_STEPS) -> Snapshot:
    began = time.perf_counter()
    with RunReader(db) as reader:
        summary = summarize(reader)
        timeline = memory_timeline(reader, buckets)
        rows = recent_steps(reader, steps, proc=timeline.proc)
    return Snapshot(summary, timeline, rows, time.perf_counter() - began)


# -- text for the header lines (formatting only) -----------------------------------------------

def status_text(s: RunSummary, live: bool) -> Text:
    text = Text()
    text.append(s.status, style=_STATUS_STYLE.get(s.status, "bold"))
    if s.signal is not None:
        text.append(f" (signal {s.signal})")
    elif s.exit_code is not None:
        text.append(f" (exit {s.exit_code})")
    if live:
        text.append(" · live", style="green")
    if s.started is not None:
        end = s.ended if s.ended is not None else time.time()
        text.append(f" · {end - s.started:.1f} s")
    text.append(f" · {s.steps} steps · {s.samples} samples · ")
    text.append(f"{s.dropped} dropped", style="bold yellow" if s.dropped else "")
    return text


def device_text(s: RunSummary) -> Text:
    procs = len(s.processes)
    text = Text(f"{s.device} · torch {s.torch or '?'}")
    if procs > 1:
        text.append(f" · {procs} processes")
    if s.median_step_s is not None:
        text.append(f" · median step {s.median_step_s * 1000:.0f} ms")
    if s.step_mode:
        text.append(f" · steps by {s.step_mode}")
    return text


def peak_text(s: RunSummary) -> Text:
    text = Text("peak ")
    if s.peak.bytes is None:
        text.append("-")
        return text
    text.append(human_bytes(s.peak.bytes), style="bold")
    text.append(f" {METRIC_LABELS.get(s.peak.metric, s.peak.metric)}")
    text.append(f" at step {s.peak.step}" if s.peak.step is not None else " outside any step")
    return text


class StepRuler(Widget):
    """One line under the sparkline: a tick where each step ended, the time span at the ends."""

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
        left, right = f"{t0:.1f}s ", f" {t1:.1f}s"
        text = Text("".join(cells), style="dim")
        if len(left) + len(right) < width:
            text = Text(left, style="dim") + text[len(left):width - len(right)] + Text(right, style="dim")
        return text


class HelpScreen(ModalScreen[None]):
    """The keys, over the overview; any of escape, q or ? closes it."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Static("[b]memscope keys[/b]", id="help-title")
            yield Static(
                "q        quit\n"
                "r        refresh now\n"
                "m        next memory metric (CUDA allocated / reserved / host RSS)\n"
                "?        this help\n"
                "↑ ↓      move in the steps table\n\n"
                "The timeline shows each time bucket's maximum; ticks under it mark\n"
                "step ends. A run still being written refreshes every "
                f"{POLL_S:g} s.\n\n"
                "[dim]escape closes this[/dim]",
                id="help-body",
            )


class MemscopeApp(App[int]):
    """Overview of one run file: what ran, memory over time, the last steps."""

    CSS_PATH = "app.tcss"
    TITLE = "memscope"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("r", "reload", "Refresh"),
        Binding("m", "next_metric", "Metric"),
        Binding("question_mark", "help", "Help", key_display="?"),
    ]

    class Loaded(Message):
        """A snapshot was read (posted from the reader thread)."""

        def __init__(self, snapshot: Snapshot) -> None:
            super().__init__()
            self.snapshot = snapshot

    class LoadFailed(Message):
        """Reading the run file failed this time (posted from the reader thread)."""

        def __init__(self, error: str) -> None:
            super().__init__()
            self.error = error

    def __init__(self, db: str, poll_s: float = POLL_S) -> None:
        super().__init__()
        self.db = db
        self.poll_s = poll_s
        self.snapshot: Snapshot | None = None
        self.metric: str | None = None     # the timeline series shown; None: the primary one
        self.live = False                  # polling because the run is still being written
        self.loads = 0                     # snapshots applied so far
        self.last_error: str | None = None
        self._loading = False
        self._poll_timer: Timer | None = None
        self._table_key: tuple[tuple[object, ...], ...] | None = None
        self._table_cuda: bool | None = None

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
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.db
        self._poll_timer = self.set_interval(self.poll_s, self._request_load, pause=True)
        self._request_load()

    # -- reading, off the UI thread ------------------------------------------------------------

    def _request_load(self) -> None:
        if self._loading:
            return
        self._loading = True
        self._load()

    @work(thread=True, group="load", exit_on_error=False)
    def _load(self) -> None:
        try:
            snapshot = load_snapshot(self.db)
        except Exception as exc:  # noqa: BLE001 - a live file can fail a read; say so, keep going
            self.post_message(self.LoadFailed(f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(self.Loaded(snapshot))

    def on_memscope_app_loaded(self, message: MemscopeApp.Loaded) -> None:
        self._loading = False
        self.snapshot = message.snapshot
        self.loads += 1
        if self.last_error is not None:
            self.last_error = None
            self.notify("reading the run file works again", timeout=2)
        self.live = message.snapshot.summary.status == "running"
        if self._poll_timer is not None:
            if self.live:
                self._poll_timer.resume()
            else:
                self._poll_timer.pause()
        self._show(message.snapshot)

    def on_memscope_app_load_failed(self, message: MemscopeApp.LoadFailed) -> None:
        self._loading = False
        if message.error != self.last_error:
            self.notify(message.error, title="cannot read the run file", severity="error", timeout=4)
        self.last_error = message.error
        # keep trying while the run may still be going (or before the first good read: a file
        # `memscope attach` has only just created may not have its tables yet)
        if self._poll_timer is not None and (self.snapshot is None or self.live):
            self._poll_timer.resume()

    # -- drawing -------------------------------------------------------------------------------

    def _show(self, snap: Snapshot) -> None:
        s = snap.summary
        command = shlex.join(s.command) if s.command else "?"
        self.query_one("#command", Static).update(Text.assemble(("memscope ", "bold"), command))
        self.query_one("#status", Static).update(status_text(s, self.live))
        self.query_one("#device", Static).update(device_text(s))
        self.query_one("#peak", Static).update(peak_text(s))
        self._show_timeline(snap.timeline)
        self._show_steps(snap.steps, cuda=any(k.startswith("cuda") for k in snap.timeline.series))

    def _show_timeline(self, tl: Timeline) -> None:
        series = tl.series.get(self.metric) if self.metric else tl.primary
        if series is None:
            series = tl.primary
        caption = self.query_one("#caption", Static)
        spark = self.query_one("#timeline", Sparkline)
        ruler = self.query_one("#ruler", StepRuler)
        if series is None or not series.points:
            caption.update("no memory samples yet")
            spark.data = []
            ruler.marks, ruler.span = (), (0.0, 0.0)
            return
        caption.update(Text.assemble(
            (series.label, "bold"),
            f" · high {human_bytes(series.max)} · low {human_bytes(series.min)}"
            f" · now {human_bytes(series.last)}"))
        spark.data = series.on_grid(BUCKETS, tl.t0, tl.t1)
        ruler.marks = tuple(tl.steps)
        ruler.span = (tl.t0, tl.t1)

    def _show_steps(self, rows: list[StepRow], cuda: bool) -> None:
        table = self.query_one("#steps", DataTable)
        key = tuple((r.step, r.end, r.peak_rss, r.peak_allocated, r.status) for r in rows)
        if key == self._table_key and cuda == self._table_cuda:
            return  # unchanged: keep the cursor and scroll position as they are
        cursor = table.cursor_row
        if cuda != self._table_cuda:
            table.clear(columns=True)
            table.add_column("step", key="step")
            table.add_column("duration", key="time")
            table.add_column("peak RSS", key="rss")
            if cuda:
                table.add_column("peak alloc", key="alloc")
                table.add_column("peak reserved", key="reserved")
            table.add_column("status", key="status")
            self._table_cuda = cuda
        else:
            table.clear()
        for r in rows:
            cells: list[str | Text] = [
                Text(str(r.step), justify="right"),
                Text(f"{r.duration_s * 1000:.0f} ms", justify="right"),
                Text(human_bytes(r.peak_rss), justify="right"),
            ]
            if cuda:
                cells += [Text(human_bytes(r.peak_allocated), justify="right"),
                          Text(human_bytes(r.peak_reserved), justify="right")]
            cells.append(Text(r.status, style="" if r.status == "ok" else "bold red"))
            table.add_row(*cells, key=str(r.step))
        self._table_key = key
        if rows:
            table.move_cursor(row=min(cursor, len(rows) - 1))

    # -- actions -------------------------------------------------------------------------------

    def action_reload(self) -> None:
        self._request_load()

    def action_next_metric(self) -> None:
        if self.snapshot is None:
            return
        names = list(self.snapshot.timeline.series)
        if len(names) < 2:
            self.notify("only one memory metric in this run" if names else "no memory samples yet",
                        timeout=2)
            return
        current = self.metric if self.metric in names else names[0]
        self.metric = names[(names.index(current) + 1) % len(names)]
        self._show_timeline(self.snapshot.timeline)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())


def run_app(db: str) -> int:
    """Run the dashboard on ``db`` in the terminal; returns the exit status."""
    app = MemscopeApp(db)
    app.run()
    return int(app.return_code or 0)
