"""A node file as the top view shows it (``memscope tui NODE.db``): the processes the daemon saw
at its last sample, with their growth over its window, read from the file.

Growth and the verdict come from the same rule over the stored samples
(:func:`memscope.node.growth.trend`); a leak suspect's "since" from the daemon's own event.
"""

from __future__ import annotations

import json
from typing import Any

from memscope.node.growth import trend
from memscope.node.monitor import ProcessRow, Snapshot
from memscope.node.nodereader import NodeReader
from memscope.node.recorded import RecordedCache

DEFAULT_WINDOW_S = 600.0


def _devices(text: Any) -> dict[int, int] | None:
    if not isinstance(text, str):
        return None
    try:
        raw = json.loads(text)
        return {int(k): int(v) for k, v in raw.items()} if isinstance(raw, dict) else None
    except (ValueError, TypeError, AttributeError):
        return None


class NodeHistory:
    """Reads a node file again and again (a daemon may still write it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._runs = RecordedCache()
        self.status = "?"

    def read(self) -> Snapshot:
        from memscope.node.report import STALE_S

        with NodeReader(self.path) as reader:
            node = reader.node()
            opts = node["options"] if isinstance(node["options"], dict) else {}
            window = float(opts.get("window") or DEFAULT_WINDOW_S)
            last = node["heartbeat"] or node["started"]
            self.status = str(node["status"])
            if self.status == "running" and node["heartbeat"] is not None:
                import time

                if time.time() - float(node["heartbeat"]) > STALE_S:
                    self.status = "abandoned"
            since = {}
            for ev in reader.events():
                if ev["kind"] == "suspect" and ev["proc"] is not None:
                    since[ev["proc"]] = (ev["data"] or {}).get("since")
                elif ev["kind"] == "suspect_cleared":
                    since.pop(ev["proc"], None)
            rows = []
            for p in reader.processes():
                if p["ended"] is not None or p["last_rss"] is None:
                    continue  # not there at the daemon's last sample
                samples = reader.samples(int(p["id"]), since=float(p["last_seen"]) - window)
                rss = trend([(float(s["t_end"]), int(s["rss_min"])) for s in samples if s["rss_min"] is not None])
                gpu_points = [(float(s["t_end"]), int(s["gpu_min"])) for s in samples if s["gpu_min"] is not None]
                row = ProcessRow(int(p["pid"]), float(p["started"]), int(p["uid"] or 0), str(p["user"] or "?"),
                                 p["argv"], int(p["last_rss"]), _devices(p["gpu_devices"]), rss,
                                 trend(gpu_points) if gpu_points else None, p["run_file"])
                if row.growing:
                    row.since = since.get(p["id"], rss.first)
                if row.run_file:
                    row.recorded = self._runs.get(row.run_file, row.pid)
                rows.append(row)
            return Snapshot(float(last), window, rows, [], opts.get("gpu_why"), host=str(node["host"]))
