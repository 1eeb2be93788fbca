"""The memscope dashboard: ``memscope tui RUN.db`` (and the foreground of ``memscope attach``).

Worker threads read :class:`~memscope_tui.data.Snapshot` objects through memscope.store and
memscope.analysis and post them to the app as messages; the UI thread only draws. The first is a
head (the overview's data: cheap, drawn first); the full read (every view) follows, each other
view showing "loading…" until it arrives. While the run is still being written (status
``running``) the head is read again every :data:`POLL_S` seconds (only rows appended since) and
drawn over the last full read; the full read is repeated only when its inputs changed, the run
ended, or :data:`FULL_EVERY_S` passed. Once the run has ended, polling stops. Seven views, one
per tab (keys 1-7).
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, Callable

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Footer, Input, Static, TabbedContent, TabPane

from memscope.display import shown, shown_text
from memscope.store.schema import RunFileError
from memscope_tui.data import HeadSource, Selection, Snapshot, load_snapshot, with_head
from memscope_tui.interrupt import INTERRUPTED, exit_on_sigint
from memscope_tui.views import View
from memscope_tui.views.breakdown import BreakdownView
from memscope_tui.views.layers import LayersView
from memscope_tui.views.leaks import LeaksView
from memscope_tui.views.oom import OomView
from memscope_tui.views.overview import OverviewView, run_state
from memscope_tui.views.ranks import RanksView
from memscope_tui.views.suggestions import SuggestionsView
from memscope_tui.widgets import SelectionChanged, StepRuler, state_line

__all__ = ["HelpScreen", "MemscopeApp", "StepRuler", "run_app"]

POLL_S = 0.5        # refresh period while the run is still being written (twice a second)
FULL_MIN_S = 2.0     # while live, full reads (the slow analyses) at most this often...
FULL_GAP = 10.0      # ...and at most every this many times their own duration...
FULL_EVERY_S = 30.0  # ...and at least this often even when their inputs did not change

# tab id -> view class, in key order 1..7
VIEWS: list[tuple[str, type[View]]] = [
    ("overview", OverviewView), ("layers", LayersView), ("leaks", LeaksView),
    ("breakdown", BreakdownView), ("suggestions", SuggestionsView), ("oom", OomView),
    ("ranks", RanksView),
]


class HelpScreen(ModalScreen[None]):
    """Every key that does something, over the dashboard; any of escape, q or ? closes it.
    tests/tui/test_layout.py checks that each binding of the app, its screens and its widgets is
    listed here (as Textual's footer writes it: ^c for ctrl+c, ← for left)."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, attached: bool, by_pid: bool = False) -> None:
        super().__init__()
        self.attached = attached
        self.by_pid = by_pid

    def compose(self) -> ComposeResult:
        views = " ".join(f"{i} {cls.TITLE}" for i, (_, cls) in enumerate(VIEWS, 1))
        hints = "\n".join(f"  {cls.TITLE:<11} {cls.HINT}" for _, cls in VIEWS if cls.HINT)
        quit_line = ("q        close the dashboard, training goes on (^q too)\n"
                     "ctrl+c   interrupt the training (as ^c would without the dashboard)\n"
                     if self.attached else "q        quit (^q and ctrl+c too)\n")
        if self.by_pid:  # memscope attach --pid: the training is not memscope's to interrupt
            quit_line = ("q        detach memscope and close the dashboard; the training goes on (^q too)\n"
                         "ctrl+c   detach memscope (the dashboard stays until q)\n")
        with VerticalScroll(id="help"):
            yield Static("[b]memscope keys[/b] [dim](↑ ↓ scroll this, escape closes it)[/dim]",
                         id="help-title")
            yield Static(
                quit_line +
                "r        refresh now\n"
                "m        next memory metric in front (CUDA allocated/reserved/peak, NVML)\n"
                "/        filter the tables (⏎ keeps the filter, escape clears it)\n"
                "?        this help\n"
                "1-7      switch view (or a click on its tab):\n"
                f"  {views}\n"
                f"{hints}\n"
                "[b]moving[/b]\n"
                "↑ ↓ pgup pgdn        rows of a table (shown in full under it), text lines\n"
                "home end ^home ^end  first / last row\n"
                "← →                  scroll sideways; on the tab bar: view before/after\n"
                "^pgup ^pgdn          a page sideways\n"
                "tab shift+tab        move the focus (the view, the tab bar)\n"
                "^p                   command palette (theme, screenshot, keys)\n"
                "super+c              copy the selected text\n"
                "[b]in the filter box[/b]\n"
                "← → ^← ^→ home end ^a ^e       move the cursor\n"
                "shift+← shift+→ shift+^← shift+^→ shift+home shift+end shift+^a  select\n"
                "⌫ del ^w ^d ^u ^k alt+⌫ ^⌫ super+⌫  delete (a word, to the start/end)\n"
                "^x ^v super+c                       cut, paste, copy\n\n"
                "Plots start at 0 B. The timeline: each time bucket's maximum, the tensors\n"
                "the inventories counted, the peak step, OOMs, attach and detach; ticks\n"
                f"under it mark step ends. A live run refreshes every {POLL_S:g} s.",
                id="help-body", markup=True,
            )

    def on_mount(self) -> None:
        self.query_one("#help", VerticalScroll).focus()  # ↑ ↓ scroll the help at 24 lines


class MemscopeApp(App[int]):
    """All views of one run file, finished or still being written."""

    CSS_PATH = "app.tcss"
    TITLE = "memscope"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("r", "reload", "Refresh"),
        Binding("m", "next_metric", "Metric", show=False),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("question_mark", "help", "Help", key_display="?"),
        # attached: interrupt the training; otherwise quit with exit status 130
        Binding("ctrl+c", "ctrl_c", show=False, priority=True),
        *[Binding(str(i), f"view('{tab}')", cls.TITLE, show=False) for i, (tab, cls) in enumerate(VIEWS, 1)],
    ]

    class Loaded(Message):
        """A snapshot was read (posted from a reader thread): a full one, or a head (``partial``)."""

        def __init__(self, snapshot: Snapshot) -> None:
            super().__init__()
            self.snapshot = snapshot

    class LoadFailed(Message):
        """Reading the run file failed this time (posted from a reader thread)."""

        def __init__(self, error: str, full: bool = True) -> None:
            super().__init__()
            self.error = error
            self.full = full

    def __init__(self, db: str, poll_s: float = POLL_S, attached: bool = False,
                 now: Callable[[], float] = time.time,
                 first: Future[Snapshot] | None = None, head: HeadSource | None = None,
                 by_pid: bool = False) -> None:
        """``attached``: opened by ``memscope attach`` in the foreground: q leaves the training
        running, ctrl+c interrupts it (``by_pid``, by ``memscope attach --pid``: both detach
        memscope, the training goes on). ``now`` is the clock for "running for N s" (tests freeze it).
        ``first``: the first head snapshot, already being read by ``head`` (started before textual
        was imported)."""
        super().__init__()
        self._first = first
        self._head = head if head is not None and first is not None else HeadSource(db)
        self.db = db
        self.poll_s = poll_s
        self.attached = attached
        self.by_pid = by_pid
        self.now = now
        self.snapshot: Snapshot | None = None  # what is drawn
        self.full: Snapshot | None = None      # the last full read (every view's data)
        self.head: Snapshot | None = None      # the last head read (the overview's, incremental)
        self.selection = Selection()
        self.filter_text = ""
        self.live = False                  # polling because the run is still being written
        self.loads = 0                     # complete snapshots drawn so far (every view's data)
        self.paints = 0                    # snapshots drawn, a partial first one included
        self.full_reads = 0                # full reads done (the slow analyses)
        self.last_error: str | None = None
        self.interrupted = False           # ctrl+c sent to the training (attached only)
        self.hold_full = False             # tests: keep the full read from starting (a slow reader)
        self.full_every_s = FULL_EVERY_S   # tests: no timed full read
        self._head_busy = self._head_again = False
        self._full_busy = self._full_again = False
        self._full_at = -1e9               # time.monotonic() when the last full read started
        self._full_inputs: tuple[Any, ...] | None = None  # the head's inputs at that time
        self._poll_timer: Timer | None = None

    def compose(self) -> ComposeResult:
        with TabbedContent(id="tabs", initial="overview"):
            for i, (tab, cls) in enumerate(VIEWS, 1):
                with TabPane(f"{i} {cls.TITLE}", id=tab):
                    if cls is not OverviewView:  # shown until the first full read arrives
                        yield Static("loading…", id=f"loading-{tab}", classes="loading")
                    yield cls(now=self.now, id=f"view-{tab}") if cls is OverviewView else cls(id=f"view-{tab}")
        yield Input(placeholder="filter: words that must appear (enter keeps, escape clears)",
                    id="filter")
        yield Static("", id="state", classes="line")
        yield Footer()

    def on_unmount(self) -> None:
        if not self._head_busy:  # a read under way closes nothing under it; the process ends anyway
            self._head.close()

    def on_mount(self) -> None:
        exit_on_sigint(self)
        self.sub_title = shown_text(self.db)
        self._poll_timer = self.set_interval(self.poll_s, self._poll, pause=True)
        self._request_head()

    # -- reading, off the UI thread ------------------------------------------------------------
    # Two readers: the head (run facts, peak, timeline, last steps; after the first read only the
    # rows appended since) on every tick, and the full read (every view) after the first paint,
    # then while the run is live only when what the analyses read changed, or the run ended, or
    # FULL_EVERY_S passed - at most one at a time, spaced by FULL_GAP times its own duration.

    def _poll(self) -> None:
        # a tick while a head read is still running is dropped
        if not self._head_busy:
            self._request_head()

    def _request_head(self) -> None:
        if self._head_busy:
            self._head_again = True
            return
        self._head_busy, self._head_again = True, False
        self._read_head()

    def _request_load(self) -> None:
        """A full read (a new selection, r, the first paint drawn)."""
        if self._full_busy or self.hold_full:
            self._full_again = True
            return
        self._full_busy, self._full_again = True, False
        self._full_at = time.monotonic()
        self._full_inputs = self.head.inputs if self.head is not None else None
        self._read_full(self.selection)

    def release_full(self) -> None:
        """Tests: let the held full read start."""
        self.hold_full = False
        if self._full_again:
            self._request_load()

    @work(thread=True, group="head", exit_on_error=False)
    def _read_head(self) -> None:
        try:
            first, self._first = self._first, None
            snapshot = first.result() if first is not None else self._head.read()
        except Exception as exc:  # noqa: BLE001 - a live file can fail a read; say so, keep going
            self.post_message(self.LoadFailed(_failure(exc), full=False))
        else:
            self.post_message(self.Loaded(snapshot))

    @work(thread=True, group="full", exit_on_error=False)
    def _read_full(self, selection: Selection) -> None:
        try:
            snapshot = load_snapshot(self.db, selection)
        except Exception as exc:  # noqa: BLE001 - a live file can fail a read; say so, keep going
            self.post_message(self.LoadFailed(_failure(exc)))
        else:
            self.post_message(self.Loaded(snapshot))

    def _done(self, full: bool) -> None:
        if full:
            self._full_busy = False
            if self._full_again:
                self._request_load()
        else:
            self._head_busy = False
            if self._head_again:
                self._request_head()

    def _full_due(self, head: Snapshot) -> bool:
        full = self.full
        if full is not None and head.summary.status != full.summary.status:
            # the run ended (or was found abandoned): its final numbers now, or right after the
            # read under way (it may have started before the end)
            self._full_again = self._full_busy
            return not self._full_busy
        if self._full_busy:
            return False
        if full is None:
            return True  # the first failed: again
        since = time.monotonic() - self._full_at
        if since < max(FULL_MIN_S, FULL_GAP * full.read_s):
            return False
        return head.inputs != self._full_inputs or since >= self.full_every_s

    def on_memscope_app_loaded(self, message: MemscopeApp.Loaded) -> None:
        snap = message.snapshot
        if snap.partial:
            self.head = snap
            if self.full is not None:
                snap = with_head(self.full, snap)
            self._apply(snap)
            if self.full is None and self.paints == 1:
                self.call_after_refresh(self._request_load)  # the first frame goes out first
            elif self._full_due(message.snapshot):
                self._request_load()
            self._done(full=False)
        else:
            self.full = snap
            self.full_reads += 1
            self._apply(snap)
            self._done(full=True)

    def _apply(self, snap: Snapshot) -> None:
        self.snapshot = snap
        self.paints += 1
        self.loads += not snap.partial
        if self.last_error is not None:
            self.last_error = None
            self.notify("reading the run file works again", timeout=2)
        was_live = self.live
        self.live = snap.summary.status == "running"
        if self._poll_timer is not None:
            if self.live:
                self._poll_timer.resume()
            else:
                self._poll_timer.pause()
        self._show(snap)
        if was_live and not self.live and self.attached:
            self.notify(f"training ended: {shown(run_state(snap.summary))}; q closes the dashboard",
                        timeout=10, markup=False)
        elif was_live and snap.summary.status == "abandoned":
            self.notify("no process is left writing this run (killed?): stopped refreshing",
                        title="run abandoned", severity="warning", timeout=10)

    def on_memscope_app_load_failed(self, message: MemscopeApp.LoadFailed) -> None:
        if message.error != self.last_error:
            self.notify(shown_text(message.error), title="cannot read the run file", severity="error",
                        timeout=4, markup=False)
        self.last_error = message.error
        # keep trying while the run may still be going (or before the first good read: a file
        # `memscope attach` has only just created may not have its tables yet)
        if self._poll_timer is not None and (self.snapshot is None or self.live):
            self._poll_timer.resume()
        self._done(message.full)

    # -- drawing -------------------------------------------------------------------------------

    def _show(self, snap: Snapshot) -> None:
        try:
            self._draw(snap)
        except NoMatches:  # a read that finished while the app was closing: nothing to draw on
            pass

    def _draw(self, snap: Snapshot) -> None:
        for view in self.query(View):
            if isinstance(view, OverviewView):
                view.show(snap, self.filter_text)
                continue
            tab = (view.id or "").removeprefix("view-")
            self.query_one(f"#loading-{tab}", Static).display = snap.partial
            view.display = not snap.partial
            if not snap.partial:
                view.show(snap, self.filter_text)
        s = snap.summary
        state = run_state(s)
        parts = [(shown(state), shown(state))]
        squeeze = None
        if self.live:  # the refresh cost; a finished run is read once (and snapshots stay fixed)
            ms = f"{snap.read_s * 1000:.0f} ms"
            parts.append((f"read in {ms} every {self.poll_s:g} s", f"read {ms}/{self.poll_s:g} s"))
        elif s.status == "abandoned":
            parts.append(("no process is left writing it: not refreshing", "no writer left: not refreshing"))
        if self.filter_text:
            squeeze = len(parts)
            parts.append((f"filter: {shown(self.filter_text)}", f"/{shown(self.filter_text)}"))
        if self.attached and self.live and self.by_pid:
            parts.append(("q or ctrl+c detaches memscope, training goes on", "q/ctrl+c: detach"))
        elif self.attached and self.live:
            parts.append(("q closes the dashboard, training goes on · ctrl+c interrupts training",
                          "q: close, training goes on · ctrl+c: interrupt"))
        line = self.query_one("#state", Static)
        room = line.content_region.width or max(self.size.width - 2, 40)
        line.update(Text(state_line(parts, room, squeeze)))  # Text: never markup
        tabs = self.query_one(TabbedContent)
        tabs.get_tab("oom").label = "6 OOM" + (" !" if s.oom is not None else "")
        tabs.get_tab("leaks").label = "3 Leaks" + (f" {len(s.leaks)}!" if s.leaks else "")

    def on_resize(self) -> None:
        if self.snapshot is not None:  # the status line's long or short forms
            self._show(self.snapshot)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self._focus_view()

    def _focus_view(self) -> None:
        """Keys go to the active view (its table or text), so its bindings and ↑↓ work."""
        pane = self.query_one(TabbedContent).active_pane
        if pane is not None:
            for widget in pane.query("DataTable, VerticalScroll"):
                if widget.focusable:
                    widget.focus()
                    return

    def on_selection_changed(self, message: SelectionChanged) -> None:
        self.selection = replace(self.selection, **message.changes)
        self._request_load()

    # -- actions -------------------------------------------------------------------------------

    def action_view(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def action_reload(self) -> None:
        self._request_head()
        self._request_load()

    def action_next_metric(self) -> None:
        if self.snapshot is None:
            return
        why_not = self.query_one(OverviewView).next_metric(self.snapshot)
        if why_not:
            self.notify(why_not, timeout=2, markup=False)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.attached, self.by_pid))

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        if self.snapshot is not None:
            self._show(self.snapshot)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.input.display = bool(event.value.strip())
        self._focus_view()

    def on_key(self, event: Any) -> None:
        box = self.query_one("#filter", Input)
        if event.key == "escape" and (box.has_focus or self.filter_text):
            box.value = ""
            box.display = False
            self._focus_view()
            event.stop()

    def action_ctrl_c(self) -> None:
        if self.attached:
            self.action_interrupt_training()
        else:  # quit, as ^C ends any command: exit status 130 (q and ^q: 0)
            self.exit(return_code=INTERRUPTED)

    def action_interrupt_training(self) -> None:
        """ctrl+c while attached: the terminal is in raw mode, so no SIGINT reached anyone. Ask
        the supervisor (our parent) to interrupt the training, as ``kill -INT`` on memscope does."""
        if not self.live:
            self.notify("training already ended; q closes the dashboard", timeout=3)
            return
        try:
            os.kill(os.getppid(), signal.SIGINT)
        except OSError as exc:
            self.notify(f"cannot interrupt the training: {exc}", severity="error", markup=False)
            return
        self.interrupted = True
        if self.by_pid:  # the attach command took the SIGINT as a request to detach
            self.notify("detaching memscope; the training goes on (the dashboard stays until q)", timeout=5)
        else:
            self.notify("interrupt sent to the training; the dashboard stays until q", timeout=5)


def run_app(db: str, attached: bool = False, first: Future[Snapshot] | None = None,
            head: HeadSource | None = None, by_pid: bool = False) -> int:
    """Run the dashboard on ``db`` in the terminal; returns the exit status. ``first``: the
    first head snapshot, being read by ``head`` (see memscope.cli.tui)."""
    app = MemscopeApp(db, attached=attached, first=first, head=head, by_pid=by_pid)
    app.run()
    return int(app.return_code or 0)


def _failure(exc: BaseException) -> str:
    """A failed read in words: a damaged or unusable file's own line (``RUN.db: damaged run
    file: steps.end holds NULL ...``), anything else with its kind."""
    return str(exc) if isinstance(exc, RunFileError) else f"{type(exc).__name__}: {exc}"
