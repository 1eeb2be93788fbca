"""The node's torch processes, sampled again and again: what ``memscope top`` shows and the
daemon writes, exports and acts on.

Each :meth:`Monitor.sample` finds the torch processes (:mod:`memscope.node.procs`), reads their
host RSS and NVML's per-process GPU memory (:mod:`memscope.node.readings`), adds them to each
process's history and says, over the last ``window_s`` seconds, how fast its memory grows and
whether it grows steadily (:mod:`memscope.node.growth`: the long-run growth rule). A recorded
process's run file gives its step rate and leak verdict (:mod:`memscope.node.recorded`).
"""

from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from memscope.node.growth import History, Trend
from memscope.node.procs import Discovery, Found, Unreadable
from memscope.node.readings import GpuReadings, rss_bytes
from memscope.node.recorded import Recorded, RecordedCache

SCHEMA = "memscope.top/1"


@dataclass
class ProcessRow:
    """One torch process at one sample."""

    pid: int
    started: float
    uid: int
    user: str
    argv: list[str]
    host_rss_bytes: int
    gpu_by_device: dict[int, int] | None  # None: no NVML reading on this machine
    rss: Trend
    gpu: Trend | None
    run_file: str | None
    since: float | None = None  # when its steady growth began (the window's start when first seen)
    recorded: Recorded | None = None

    @property
    def command(self) -> str:
        return " ".join(self.argv)

    @property
    def gpu_bytes(self) -> int | None:
        return None if self.gpu_by_device is None else sum(self.gpu_by_device.values())

    @property
    def growing(self) -> bool:
        return self.rss.growing or (self.gpu is not None and self.gpu.growing)

    @property
    def growing_on(self) -> str | None:
        """What grows steadily: ``host_rss``, ``gpu`` (the faster of both when both do), or None."""
        if self.gpu is not None and self.gpu.growing and (not self.rss.growing
                                                           or self.gpu.bytes_per_s > self.rss.bytes_per_s):
            return "gpu"
        return "host_rss" if self.rss.growing else None

    @property
    def growth_bytes_per_s(self) -> float:
        """Host RSS growth, or the GPU's where that is what grows steadily."""
        if self.growing_on == "gpu" and self.gpu is not None:
            return self.gpu.bytes_per_s
        return self.rss.bytes_per_s

    def as_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "user": self.user, "command": self.command,
                "host_rss_bytes": self.host_rss_bytes, "gpu_bytes": self.gpu_bytes,
                "growth_bytes_per_s": round(self.growth_bytes_per_s, 1), "growing": self.growing,
                "run_file": self.run_file,
                # additive to memscope.top/1
                "argv": self.argv, "uid": self.uid, "started": self.started,
                "gpu_by_device": (None if self.gpu_by_device is None
                                  else {str(k): v for k, v in sorted(self.gpu_by_device.items())}),
                "host_rss_growth_bytes_per_s": round(self.rss.bytes_per_s, 1),
                "gpu_growth_bytes_per_s": None if self.gpu is None else round(self.gpu.bytes_per_s, 1),
                "growing_on": self.growing_on, "growing_since": self.since,
                "samples": self.rss.samples,
                "recorded": None if self.recorded is None else self.recorded.as_json()}


@dataclass
class Snapshot:
    t: float
    window_s: float
    processes: list[ProcessRow]
    unreadable: list[Unreadable]
    gpu_why: str | None  # why the GPU columns are empty (None: NVML reads per-process memory)
    host: str = field(default_factory=socket.gethostname)

    def as_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "processes": [p.as_json() for p in self.processes],
                # additive to memscope.top/1
                "host": self.host, "t": self.t, "window_s": self.window_s,
                "gpu": {"available": self.gpu_why is None, "why": self.gpu_why},
                "unreadable": [{"pid": u.pid, "uid": u.uid, "user": u.user, "command": u.command,
                                "why": u.why} for u in self.unreadable],
                "as_root": os.geteuid() == 0}


class Monitor:
    """Samples the node's torch processes; keeps each one's history for ``window_s`` seconds."""

    def __init__(self, window_s: float, gpu: GpuReadings | None = None, read_runs: bool = True,
                 discovery: Discovery | None = None, match: re.Pattern[str] | None = None) -> None:
        """``match``: only the processes whose command line (secrets taken out) it finds."""
        self.window_s = window_s
        self.match = match
        self.gpu = gpu if gpu is not None else GpuReadings()
        self.read_runs = read_runs
        self.discovery = discovery if discovery is not None else Discovery()
        self._history: dict[tuple[int, float], History] = {}
        self._since: dict[tuple[int, float], float] = {}
        self._runs = RecordedCache()

    def sample(self, now: float | None = None) -> Snapshot:
        now = time.time() if now is None else now
        found, unreadable = self.discovery.scan(now)
        gpu = self.gpu.read()
        rows = []
        seen = set()
        for f in found:
            if self.match is not None and not self.match.search(f.command):
                continue
            rss = rss_bytes(f.pid)
            if rss is None:
                continue  # ended between the scan and this read
            row = self._row(f, rss, gpu, now)
            seen.add((f.pid, f.started))
            rows.append(row)
        for key in [k for k in self._history if k not in seen]:
            del self._history[key]  # ended
            self._since.pop(key, None)
        if self.read_runs:
            self._runs.forget_except({(r.run_file, r.pid) for r in rows if r.run_file})
        rows.sort(key=lambda r: r.pid)
        return Snapshot(now, self.window_s, rows, unreadable, self.gpu.why)

    def _row(self, f: Found, rss: int, gpu: dict[int, dict[int, int]], now: float) -> ProcessRow:
        key = (f.pid, f.started)
        hist = self._history.get(key)
        if hist is None:
            hist = self._history[key] = History(self.window_s)
        per_device = None if self.gpu.why is not None else gpu.get(f.pid, {})
        hist.add(now, rss, None if per_device is None else sum(per_device.values()))
        rss_trend, gpu_trend = hist.trends(self.window_s)
        row = ProcessRow(f.pid, f.started, f.uid, f.user, f.argv, rss, per_device, rss_trend, gpu_trend,
                         f.run_file)
        if row.growing:
            first = (gpu_trend if row.growing_on == "gpu" and gpu_trend is not None else rss_trend).first
            row.since = self._since.setdefault(key, first if first is not None else now)
        else:
            self._since.pop(key, None)
        if self.read_runs and f.run_file:
            row.recorded = self._runs.get(f.run_file, f.pid)
        return row

    def close(self) -> None:
        self.gpu.close()
