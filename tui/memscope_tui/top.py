"""``memscope top``: every process of this host with torch loaded, one row each, live.

The numbers come from memscope.node (a :class:`~memscope.node.monitor.Monitor` sampling /proc and
NVML on a worker thread, or a daemon's node file: ``memscope tui NODE.db``); this module only
draws them and runs the commands a key asks for, as a user would:

- ``enter``: the selected process's dashboard. A process memscope does not record yet is first
  attached by pid (``memscope attach --pid PID --headless``, in the background: it records until
  ``d``, the process's end, or this view's end); its run file is the one the process then holds
  open. The dashboard (``memscope tui RUN.db``) takes the terminal; ``q`` there comes back here.
- ``d``: ``memscope detach PID`` (the recording ends, the training goes on).
- ``s``: the next sort order (growth, host RSS, GPU memory, pid); a click on a heading sorts by it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.message import Message
from textual.widgets import DataTable, Footer, Static

from memscope.display import shown
from memscope.node.autoattach import run_file_name
from memscope.node.monitor import Monitor, ProcessRow, Snapshot
from memscope.node.procs import alive
from memscope.node.target import open_run_files
from memscope.units import human_bytes
from memscope_tui.interrupt import INTERRUPTED, exit_on_sigint
from memscope_tui.widgets import RowTable, fill_table, plain, right, state_line

# (label, key function, column key): cycled with s, most important first
SORTS: list[tuple[str, Callable[[ProcessRow], Any], str]] = [
    ("growth", lambda r: (-r.growth_bytes_per_s, r.pid), "growth"),
    ("host RSS", lambda r: (-r.host_rss_bytes, r.pid), "rss"),
    ("GPU memory", lambda r: (-(r.gpu_bytes or 0), r.pid), "gpu"),
    ("pid", lambda r: r.pid, "pid"),
]
COLUMNS = [("PID", "pid"), ("USER", "user"), ("RSS", "rss"), ("GROWTH", "growth"), ("GPU", "gpu"),
           ("RECORDED", "recorded"), ("COMMAND", "command")]
ATTACH_WAIT_S = 120.0  # for the attach command's agent to start (it has its own, shorter, bounds)
DETACH_WAIT_S = 15.0  # at exit, for a recording this view started to detach


class LiveSource:
    """Samples this host (memscope.node.monitor)."""

    live = True

    def __init__(self, window: float) -> None:
        self.monitor = Monitor(window)
        self.what = "this host"

    def read(self) -> Snapshot:
        return self.monitor.sample()

    def close(self) -> None:
        self.monitor.close()


class FileSource:
    """A daemon's node file (memscope.node.history): what it saw at its last sample."""

    live = False

    def __init__(self, path: str) -> None:
        from memscope.node.history import NodeHistory

        self.history = NodeHistory(path)
        self.what = path

    def read(self) -> Snapshot:
        return self.history.read()

    def close(self) -> None:
        pass


@dataclass
class _Attaching:
    pid: int
    popen: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def attached(self) -> bool:
        return any(ln.startswith("memscope: attached to pid") for ln in self.lines)


def _end_attach(att: _Attaching) -> None:
    """The view is closing: the attach command it started detaches (its ^C). One still injecting
    is let finish first: stopping it while the debugger holds the process would be worse."""
    until = time.monotonic() + ATTACH_WAIT_S
    while att.popen.poll() is None and not att.attached() and time.monotonic() < until:
        time.sleep(0.1)
    if att.popen.poll() is None:
        try:
            att.popen.send_signal(signal.SIGINT)
            att.popen.wait(timeout=DETACH_WAIT_S)
        except (OSError, subprocess.TimeoutExpired):
            pass


class TopApp(App[int]):
    """One row per torch process; Enter opens its dashboard (attaching first), d detaches."""

    CSS_PATH = "top.tcss"
    TITLE = "memscope top"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("enter", "open", "Dashboard", priority=True),  # before the table's own select
        Binding("d", "detach", "Detach"),
        Binding("s", "sort", "Sort"),
        Binding("r", "refresh_now", "Refresh"),
        Binding("ctrl+c", "interrupt", show=False, priority=True),  # quit, exit status 130
    ]

    class Sampled(Message):
        def __init__(self, snapshot: Snapshot | None, error: str | None = None) -> None:
            super().__init__()
            self.snapshot = snapshot
            self.error = error

    class Said(Message):
        """A line from a command this view ran (attach, detach), for a notification."""

        def __init__(self, text: str, error: bool = False) -> None:
            super().__init__()
            self.text = text
            self.error = error

    class Recorded(Message):
        """The process is recorded now: open its dashboard."""

        def __init__(self, pid: int, run_file: str) -> None:
            super().__init__()
            self.pid = pid
            self.run_file = run_file

    def __init__(self, source: LiveSource | FileSource, interval: float = 1.0, attach_dir: str = ".") -> None:
        """``attach_dir``: where Enter's attaches write their run files."""
        super().__init__()
        self.source = source
        self.attach_dir = attach_dir
        self.interval = interval
        self.snapshot: Snapshot | None = None
        self.sort_index = 0
        self.rows: dict[str, ProcessRow] = {}
        self.samples = 0
        self.drawn: dict[str, Any] = {}
        self.attaching: dict[int, _Attaching] = {}
        self.dashboards: list[str] = []  # run files whose dashboard this view opened (or tried to)
        self.said: list[str] = []  # every line a command said here, in order
        self._busy = False

    def compose(self) -> ComposeResult:
        yield Static("sampling…", id="top-caption", classes="line")
        yield RowTable(id="top-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="top-detail", classes="caption")
        yield Footer()

    def on_mount(self) -> None:
        exit_on_sigint(self)
        self.sub_title = shown(self.source.what)
        self.query_one("#top-table", DataTable).focus()
        self._sample()
        self.set_interval(self.interval, self._sample)

    def on_unmount(self) -> None:
        for att in self.attaching.values():  # recordings this view started end with it: detach them
            _end_attach(att)
        self.source.close()

    # -- sampling, off the UI thread -----------------------------------------------------------

    def _sample(self) -> None:
        if not self._busy:
            self._busy = True
            self._read()

    @work(thread=True, group="sample", exit_on_error=False)
    def _read(self) -> None:
        try:
            snap = self.source.read()
        except Exception as exc:  # noqa: BLE001 - a node file being written, a process gone: next time
            self.post_message(self.Sampled(None, f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(self.Sampled(snap))

    def on_top_app_sampled(self, message: TopApp.Sampled) -> None:
        self._busy = False
        if message.snapshot is None:
            self.notify(shown(message.error or "?"), title="cannot read", severity="error", timeout=3,
                        markup=False)
            return
        self.snapshot = message.snapshot
        self.samples += 1
        try:
            self._draw()
        except NoMatches:  # a sample that arrived while the view was closing: nothing to draw on
            pass

    # -- drawing -------------------------------------------------------------------------------

    def sorted_rows(self) -> list[ProcessRow]:
        snap = self.snapshot
        return sorted(snap.processes, key=SORTS[self.sort_index][1]) if snap is not None else []

    def _draw(self) -> None:
        snap = self.snapshot
        if snap is None:
            return
        table = self.query_one("#top-table", DataTable)
        selected = self.selected_key()
        rows = self.sorted_rows()
        self.rows = {str(r.pid): r for r in rows}
        sort_col = SORTS[self.sort_index][2]
        columns = [(label + (" ▼" if key == sort_col else ""), key) for label, key in COLUMNS]
        fill_table(table, columns, [(str(r.pid), _cells(r, snap)) for r in rows], self.drawn, "top")
        if selected in self.rows:
            table.move_cursor(row=[str(r.pid) for r in rows].index(selected))
        parts = [(f"{len(rows)} torch process{'es' if len(rows) != 1 else ''} on {shown(snap.host)}",
                  f"{len(rows)} procs")]
        parts.append((f"growth over {snap.window_s:g} s", f"{snap.window_s:g} s"))
        parts.append((f"by {SORTS[self.sort_index][0]}", SORTS[self.sort_index][0]))
        if snap.gpu_why:
            parts.append((f"GPU: {snap.gpu_why}", "no GPU readings"))
        if snap.unreadable:
            n = len(snap.unreadable)
            parts.append((f"{n} Python process{'es' if n != 1 else ''} of other users unreadable (not root)",
                          f"{n} unreadable"))
        if not self.source.live:
            parts.append((f"the daemon's last sample, {time.strftime('%H:%M:%S', time.localtime(snap.t))}",
                          "history"))
        caption = self.query_one("#top-caption", Static)
        room = caption.content_region.width or max(self.size.width - 2, 40)
        caption.update(Text(state_line(parts, room)))
        self._detail()

    def _detail(self) -> None:
        key = self.selected_key()
        row = self.rows.get(key) if key is not None else None
        detail = self.query_one("#top-detail", Static)
        if row is None:
            detail.update(Text("no torch process on this host" if not self.rows else ""))
            return
        words = [f"pid {row.pid} · {shown(row.user)} · {shown(row.command, 300)}"]
        if row.growing:
            what = "GPU memory" if row.growing_on == "gpu" else "host RSS"
            since = time.strftime("%H:%M:%S", time.localtime(row.since)) if row.since else "?"
            words.append(f"leak suspect: {what} grows steadily since {since}")
        if row.run_file:
            words.append(f"recorded into {shown(row.run_file, 200)}")
        detail.update(Text("\n".join(words)))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        try:
            self._detail()
        except NoMatches:
            pass

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        for i, (_label, _key, col) in enumerate(SORTS):
            if col == str(event.column_key.value):
                self.sort_index = i
                self._draw()
                return

    def selected_key(self) -> str | None:
        table = self.query_one("#top-table", DataTable)
        if not table.row_count:
            return None
        try:
            return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)
        except Exception:  # noqa: BLE001 - no row under the cursor
            return None

    def selected(self) -> ProcessRow | None:
        key = self.selected_key()
        return self.rows.get(key) if key is not None else None

    # -- actions -------------------------------------------------------------------------------

    def action_interrupt(self) -> None:
        self.exit(return_code=INTERRUPTED)

    def action_sort(self) -> None:
        self.sort_index = (self.sort_index + 1) % len(SORTS)
        self._draw()

    def action_refresh_now(self) -> None:
        self._sample()

    def action_open(self) -> None:
        row = self.selected()
        if row is None:
            return
        if not alive(row.pid, row.started):
            if row.run_file:
                self.open_dashboard(row.run_file)
            else:
                self._say(f"pid {row.pid} is not running on this host: nothing to attach to", error=True)
            return
        files = open_run_files(row.pid)
        if files:
            self.open_dashboard(files[0])
            return
        if row.pid in self.attaching and self.attaching[row.pid].popen.poll() is None:
            self._say(f"already attaching to pid {row.pid}…")
            return
        self._start_attach(row.pid)

    def _start_attach(self, pid: int) -> None:
        db = run_file_name(self.attach_dir, pid)
        popen = subprocess.Popen([sys.executable, "-m", "memscope", "attach", "--pid", str(pid), "--headless",
                                  "--db", db],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True)
        att = self.attaching[pid] = _Attaching(pid, popen)
        threading.Thread(target=self._drain, args=(att,), daemon=True, name="memscope-top-attach").start()
        self._say(f"attaching to pid {pid} (memscope attach --pid {pid} --db {db}); its dashboard opens once "
                  "it records")
        self._wait_recorded(att)

    @staticmethod
    def _drain(att: _Attaching) -> None:
        assert att.popen.stderr is not None
        for line in att.popen.stderr:
            att.lines.append(line.rstrip("\n"))

    @work(thread=True, group="attach", exit_on_error=False)
    def _wait_recorded(self, att: _Attaching) -> None:
        until = time.monotonic() + ATTACH_WAIT_S
        while time.monotonic() < until:
            files = open_run_files(att.pid)
            if files and att.attached():
                self.post_message(self.Recorded(att.pid, files[0]))
                return
            if att.popen.poll() is not None:
                time.sleep(0.2)  # its last line
                errors = [ln for ln in att.lines if ln.startswith("memscope: error:")]
                self.post_message(self.Said(errors[-1] if errors else
                                            f"memscope attach --pid {att.pid} ended (exit {att.popen.returncode})",
                                            error=True))
                return
            time.sleep(0.1)
        self.post_message(self.Said(f"pid {att.pid}: no recording after {ATTACH_WAIT_S:g} s", error=True))

    def on_top_app_recorded(self, message: TopApp.Recorded) -> None:
        self._say(f"recording pid {message.pid} into {message.run_file}")
        self._sample()
        self.open_dashboard(message.run_file)

    def open_dashboard(self, run_file: str) -> None:
        """``memscope tui RUN.db`` on this terminal; back here when it closes."""
        self.dashboards.append(run_file)
        try:
            with self.suspend():
                subprocess.run([sys.executable, "-m", "memscope", "tui", run_file], check=False)
        except Exception as exc:  # noqa: BLE001 - SuspendNotSupported: no terminal to hand over
            self._say(f"cannot open the dashboard here ({type(exc).__name__}): memscope tui {run_file}",
                      error=True)
            return
        self.refresh()
        self._sample()

    def action_detach(self) -> None:
        row = self.selected()
        if row is None:
            return
        if not row.run_file and not open_run_files(row.pid):
            self._say(f"pid {row.pid} is not recorded by memscope: nothing to detach", error=True)
            return
        self._say(f"detaching from pid {row.pid}…")
        self._run_detach(row.pid)

    @work(thread=True, group="detach", exit_on_error=False)
    def _run_detach(self, pid: int) -> None:
        out = subprocess.run([sys.executable, "-m", "memscope", "detach", str(pid)], capture_output=True,
                             text=True, stdin=subprocess.DEVNULL)
        lines = out.stderr.strip().splitlines()
        self.post_message(self.Said(lines[-1] if lines else f"memscope detach {pid}: exit {out.returncode}",
                                    error=out.returncode != 0))

    def on_top_app_said(self, message: TopApp.Said) -> None:
        self._say(message.text, message.error)
        self._sample()

    def _say(self, text: str, error: bool = False) -> None:
        text = text.removeprefix("memscope: ")
        self.said.append(text)
        self.notify(shown(text, 300), severity="error" if error else "information", timeout=6, markup=False)


def _cells(r: ProcessRow, snap: Snapshot) -> list[Any]:
    growth = f"+{human_bytes(r.growth_bytes_per_s)}/s" if r.growth_bytes_per_s >= 1 else "0"
    growth_cell = Text(growth, style="bold red" if r.growing else "", justify="right")
    if r.gpu_by_device is None:
        gpu: Any = plain("-" if snap.gpu_why else "?")
    else:
        gpu = plain(" ".join(f"{i}:{human_bytes(b)}" for i, b in sorted(r.gpu_by_device.items()) if b) or "0")
    if r.run_file:
        rec = r.recorded.words if r.recorded is not None else "recorded"
        if r.recorded is not None and r.recorded.steps_per_s:
            rec = f"{r.recorded.steps_per_s:.1f} st/s · {rec}"
    else:
        rec = "-"
    return [right(str(r.pid)), plain(r.user, 12), right(human_bytes(r.host_rss_bytes)), growth_cell, gpu,
            plain(rec, 48), plain(r.command, 200)]


def run_top(window: float, interval: float) -> int:
    app = TopApp(LiveSource(window), interval)
    app.run()
    return int(app.return_code or 0)


def run_top_file(path: str, interval: float = 2.0) -> int:
    app = TopApp(FileSource(path), interval)
    app.run()
    return int(app.return_code or 0)

