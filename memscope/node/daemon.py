"""``memscope daemon``: the node's torch processes, sampled headless and for as long as it runs.

Every ``interval`` seconds: one :class:`~memscope.node.monitor.Monitor` sample, written to the
node file (:mod:`memscope.node.nodefile`, folded by time every minute); a process whose memory
grows steadily over the last ``window`` seconds is flagged a leak suspect (an event with its
rate and since when, and one line on stderr), and unflagged when it stops growing or ends. With
``prometheus`` the latest sample is served as metrics (:mod:`memscope.node.exporter`); with
``auto_attach`` a suspect gets the deep agent for a bounded number of steps
(:mod:`memscope.node.autoattach`).
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from memscope.display import shown
from memscope.node import autoattach
from memscope.node.monitor import Monitor, ProcessRow, Snapshot
from memscope.node.nodefile import NodeWriter
from memscope.node.nodefold import FOLD_EVERY_S
from memscope.units import human_bytes


@dataclass
class DaemonOptions:
    db: str
    interval: float = 5.0
    window: float = 600.0
    prometheus: tuple[str, int] | None = None
    auto_attach: bool = False
    attach_steps: int = 100
    attach_dir: str | None = None
    match: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"interval": self.interval, "window": self.window,
                "prometheus": None if self.prometheus is None else f"{self.prometheus[0]}:{self.prometheus[1]}",
                "auto_attach": self.auto_attach, "attach_steps": self.attach_steps,
                "attach_dir": self.attach_dir, "match": self.match, "as_root": os.geteuid() == 0}


def _when(t: float | None) -> str:
    return "?" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


class Daemon:
    def __init__(self, options: DaemonOptions, say: Callable[[str], None]) -> None:
        self.options = options
        self.say = say
        self.latest: Snapshot | None = None
        self.exporter: Any = None
        self._flagged: dict[tuple[int, float], ProcessRow] = {}
        self._tried: set[tuple[int, float]] = set()
        self._attach: autoattach.Attach | None = None
        self._held: dict[int, float] = {}  # pid -> until when an attach's pause is in the window
        self.samples = 0

    def run(self, stop: threading.Event) -> None:
        opts = self.options
        writer = NodeWriter(opts.db, opts.as_json())
        monitor = Monitor(opts.window, match=re.compile(opts.match) if opts.match else None)
        try:
            if opts.prometheus is not None:
                from memscope.node.exporter import Exporter

                try:
                    self.exporter = Exporter(opts.prometheus[0], opts.prometheus[1], lambda: self.latest)
                except OSError as exc:
                    raise OSError(exc.errno, f"--prometheus {opts.prometheus[0]}:{opts.prometheus[1]}: "
                                  f"cannot listen there ({exc.strerror})") from None
                writer.set_option("prometheus_bound", self.exporter.address)
                self.say(f"memscope: Prometheus metrics on http://{self.exporter.address}/metrics")
            self.say(f"memscope: watching the torch processes of this host every {opts.interval:g} s "
                     f"(growth over {opts.window:g} s) into {opts.db}"
                     + ("" if os.geteuid() == 0 else "; not root: other users' processes are not touched"))
            next_fold = time.monotonic() + FOLD_EVERY_S
            while not stop.is_set():
                began = time.monotonic()
                snap = monitor.sample()
                writer.write(snap)
                self.latest = snap
                self.samples += 1
                self._suspects(snap, writer)
                if opts.auto_attach:
                    self._auto_attach(snap, writer)
                if time.monotonic() >= next_fold:
                    writer.fold()
                    next_fold = time.monotonic() + FOLD_EVERY_S
                stop.wait(max(0.0, opts.interval - (time.monotonic() - began)))
        finally:
            try:
                if self._attach is not None:
                    autoattach.stop(self._attach)
                    self._attach_done(writer)
                if self.exporter is not None:
                    self.exporter.close()
            finally:
                monitor.close()
                writer.close()

    # -- leak suspects ---------------------------------------------------------------------------

    def _suspects(self, snap: Snapshot, writer: NodeWriter) -> None:
        now_keys = {(r.pid, r.started): r for r in snap.processes}
        for key, row in now_keys.items():
            if row.growing and key not in self._flagged:
                self._flagged[key] = row
                what = "GPU memory" if row.growing_on == "gpu" else "host RSS"
                writer.event("suspect", f"leak suspect: pid {row.pid} ({row.command[:120]}): {what} grows "
                             f"{human_bytes(row.growth_bytes_per_s)}/s since {_when(row.since)}",
                             {"pid": row.pid, "metric": row.growing_on, "bytes_per_s": round(row.growth_bytes_per_s),
                              "since": row.since, "window_s": snap.window_s, "rss_bytes": row.host_rss_bytes,
                              "gpu_bytes": row.gpu_bytes},
                             proc=writer.proc_id(row.pid, row.started), t=snap.t)
                self.say(f"memscope: leak suspect: pid {row.pid} ({shown(row.command, 80)}): {what} grows "
                         f"{human_bytes(row.growth_bytes_per_s)}/s since {_when(row.since)}")
            elif not row.growing and key in self._flagged and not self._attaching(row.pid):
                # (an attach stops the process while the debugger injects: a pause, not the end of a leak)
                del self._flagged[key]
                writer.event("suspect_cleared", f"pid {row.pid} no longer grows steadily",
                             {"pid": row.pid, "why": "stopped growing"}, proc=writer.proc_id(row.pid, row.started),
                             t=snap.t)
        for key in [k for k in self._flagged if k not in now_keys]:
            del self._flagged[key]
            writer.event("suspect_cleared", f"pid {key[0]} ended", {"pid": key[0], "why": "ended"},
                         proc=writer.proc_id(*key), t=snap.t)

    # -- auto-attach ---------------------------------------------------------------------------

    def _attaching(self, pid: int) -> bool:
        """Whether an attach of the daemon's own paused ``pid`` within the window: the debugger
        stops the process while it injects, and the window that holds that pause says nothing
        of the leak."""
        if self._attach is not None and self._attach.pid == pid:
            return True
        return time.monotonic() < self._held.get(pid, 0.0)

    def _auto_attach(self, snap: Snapshot, writer: NodeWriter) -> None:
        if self._attach is not None:
            if self._attach.popen.poll() is None:
                return
            self._attach_done(writer)
        for row in snap.processes:
            key = (row.pid, row.started)
            if not row.growing or key in self._tried or row.run_file:
                continue
            self._tried.add(key)
            proc = writer.proc_id(row.pid, row.started)
            why = autoattach.may_touch(row.uid)
            if why is not None:
                writer.event("attach_skipped", f"pid {row.pid}: {why}", {"pid": row.pid, "why": why}, proc=proc)
                self.say(f"memscope: not attaching to pid {row.pid}: {why}")
                continue
            directory = self.options.attach_dir or os.path.dirname(os.path.abspath(self.options.db))
            self._attach = autoattach.start(row.pid, row.started, proc, directory, self.options.attach_steps)
            writer.event("attach_started", f"attaching the deep agent to pid {row.pid} for "
                         f"{self.options.attach_steps} steps into {self._attach.run_file}",
                         {"pid": row.pid, "run_file": self._attach.run_file, "steps": self.options.attach_steps},
                         proc=proc)
            self.say(f"memscope: attaching to leak suspect pid {row.pid} for {self.options.attach_steps} steps "
                     f"({self._attach.run_file})")
            return  # one at a time

    def _attach_done(self, writer: NodeWriter) -> None:
        attach = self._attach
        if attach is None:
            return
        self._attach = None
        self._held[attach.pid] = time.monotonic() + self.options.window
        data = attach.result()
        if data.get("exit_code") == 0 and data.get("leak_verdict"):
            words = data.get("words", "")
            where = f" ({data['site']})" if data.get("site") else ""
            message = f"pid {attach.pid}: {words}{where}; run file {attach.run_file}"
        else:
            message = f"pid {attach.pid}: attach failed: {data.get('error') or 'exit ' + str(data.get('exit_code'))}"
        writer.event("attach_done", message, data, proc=attach.proc_id)
        self.say(f"memscope: {message}")
