"""``memscope report NODE.db``: what a daemon saw on its node: processes, their peaks and growth,
the leak suspects it flagged and the attaches it made (text, or ``memscope.node/1`` JSON).

The growth of a process over its whole history is the same rule the daemon applies to its window
(:func:`memscope.node.growth.trend`), over the lowest level of each stored sample or window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from memscope.display import shown
from memscope.node.growth import trend
from memscope.node.nodereader import NodeReader
from memscope.units import human_bytes

SCHEMA = "memscope.node/1"
STALE_S = 120.0  # a node file that says running with no write for this long: no daemon is left


@dataclass
class NodeProcess:
    row: dict[str, Any]
    growth_bytes_per_s: float
    growing: bool
    history_s: float
    suspects: list[dict[str, Any]] = field(default_factory=list)
    attaches: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        r = self.row
        return {"pid": r["pid"], "user": r["user"], "command": " ".join(r["argv"]), "argv": r["argv"],
                "started": r["started"], "first_seen": r["first_seen"], "last_seen": r["last_seen"],
                "ended": r["ended"], "host_rss_bytes": r["last_rss"], "peak_host_rss_bytes": r["peak_rss"],
                "peak_host_rss_at": r["peak_rss_t"], "gpu_bytes": r["last_gpu"], "peak_gpu_bytes": r["peak_gpu"],
                "peak_gpu_at": r["peak_gpu_t"], "growth_bytes_per_s": round(self.growth_bytes_per_s, 1),
                "growing": self.growing, "run_file": r["run_file"], "suspects": self.suspects,
                "attaches": self.attaches}


@dataclass
class NodeSummary:
    node: dict[str, Any]
    status: str
    processes: list[NodeProcess]
    unattributed: list[dict[str, Any]]  # events of no process (daemon starts, stops)

    def as_json(self) -> dict[str, Any]:
        n = self.node
        return {"schema": SCHEMA,
                "node": {"host": n["host"], "started": n["started"], "ended": n["ended"], "status": self.status,
                         "memscope_version": n["memscope_version"], "options": n["options"]},
                "processes": [p.as_json() for p in self.processes],
                "suspects": [s for p in self.processes for s in p.suspects],
                "attaches": [a for p in self.processes for a in p.attaches]}


def summarize_node(reader: NodeReader, now: float | None = None) -> NodeSummary:
    now = time.time() if now is None else now
    node = reader.node()
    status = str(node["status"])
    if status == "running" and (node["heartbeat"] is None or now - float(node["heartbeat"]) > STALE_S):
        status = "abandoned"
    events = reader.events()
    by_proc: dict[int | None, list[dict[str, Any]]] = {}
    for ev in events:
        by_proc.setdefault(ev["proc"], []).append(ev)
    out = []
    for row in reader.processes():
        points = [(float(s["t_end"]), int(s["rss_min"])) for s in reader.samples(int(row["id"]))
                  if s["rss_min"] is not None]
        tr = trend(points)
        np = NodeProcess(row, tr.bytes_per_s, tr.growing,
                         (points[-1][0] - points[0][0]) if len(points) > 1 else 0.0)
        _events_of(np, by_proc.get(int(row["id"]), []))
        out.append(np)
    # suspects first (the longest flagged first), then by peak host RSS
    out.sort(key=lambda p: (not p.suspects, -(p.row["peak_rss"] or 0), p.row["pid"]))
    return NodeSummary(node, status, out, by_proc.get(None, []))


def _events_of(np: NodeProcess, events: list[dict[str, Any]]) -> None:
    pid = np.row["pid"]
    for ev in events:
        data = ev["data"] or {}
        if ev["kind"] == "suspect":
            np.suspects.append({"pid": pid, "flagged": ev["t"], "since": data.get("since"),
                                "metric": data.get("metric"), "bytes_per_s": data.get("bytes_per_s"),
                                "cleared": None, "cleared_why": None})
        elif ev["kind"] == "suspect_cleared" and np.suspects and np.suspects[-1]["cleared"] is None:
            np.suspects[-1]["cleared"] = ev["t"]
            np.suspects[-1]["cleared_why"] = data.get("why")
        elif ev["kind"] == "attach_started":
            np.attaches.append({"pid": pid, "started": ev["t"], "run_file": data.get("run_file"), "ended": None,
                                "exit_code": None, "leak_verdict": None, "held_by": None, "site": None,
                                "bytes_per_step": None, "error": None})
        elif ev["kind"] == "attach_done" and np.attaches:
            a = np.attaches[-1]
            a["ended"] = ev["t"]
            for key in ("exit_code", "leak_verdict", "held_by", "site", "bytes_per_step", "error", "steps"):
                if key in data:
                    a[key] = data[key]
        elif ev["kind"] == "attach_skipped":
            np.attaches.append({"pid": pid, "started": ev["t"], "run_file": None, "ended": ev["t"],
                                "exit_code": None, "leak_verdict": None, "held_by": None, "site": None,
                                "bytes_per_step": None, "error": data.get("why") or ev["message"]})


def _clock(t: float | None, day: bool = False) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S" if day else "%H:%M:%S", time.localtime(t))


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def render_node(s: NodeSummary) -> str:
    n = s.node
    opts = n["options"] or {}
    lines = [f"node      {shown(n['host'])}: memscope daemon from {_clock(n['started'], True)}"
             f" to {_clock(n['ended'], True) if n['ended'] else 'now'} ({s.status})"]
    every = [f"every {opts['interval']:g} s" if isinstance(opts.get("interval"), (int, float)) else None,
             f"growth over {opts['window']:g} s" if isinstance(opts.get("window"), (int, float)) else None,
             "auto-attach on" if opts.get("auto_attach") else None]
    lines.append("sampling  " + ", ".join(w for w in every if w))
    suspects = sum(len(p.suspects) for p in s.processes)
    attaches = sum(len([a for a in p.attaches if a["run_file"]]) for p in s.processes)
    lines.append(f"processes {len(s.processes)} torch process{'es' if len(s.processes) != 1 else ''} seen; "
                 f"{suspects} leak suspect{'s' if suspects != 1 else ''}; "
                 f"{attaches} attach{'es' if attaches != 1 else ''}")
    if s.processes:
        lines.append("")
        lines.append(f"  {'PID':>7}  {'USER':<8} {'RSS':>10} {'PEAK RSS':>10} {'PEAK GPU':>10} "
                     f"{'GROWTH':>12}  {'SEEN':>8}  COMMAND")
        for p in s.processes:
            r = p.row
            growth = f"+{human_bytes(p.growth_bytes_per_s)}/s" if p.growth_bytes_per_s >= 1 else "0"
            mark = "  growing" if p.growing else ""
            ended = "  ended" if r["ended"] is not None else ""
            lines.append(f"  {r['pid']:>7}  {shown(r['user'], 8):<8} {human_bytes(r['last_rss']):>10} "
                         f"{human_bytes(r['peak_rss']):>10} {_gpu(r['peak_gpu']):>10} {growth:>12}  "
                         f"{_span(p.history_s):>8}  {shown(' '.join(r['argv']), 60)}{mark}{ended}")
    flagged = [(p, sp) for p in s.processes for sp in p.suspects]
    if flagged:
        lines += ["", "leak suspects"]
        for p, sp in flagged:
            what = "GPU memory" if sp["metric"] == "gpu" else "host RSS"
            rate = human_bytes(sp["bytes_per_s"]) if sp["bytes_per_s"] is not None else "?"
            cleared = (f"; cleared {_clock(sp['cleared'])} ({shown(sp['cleared_why'])})"
                       if sp["cleared"] is not None else "; still flagged at the end")
            lines.append(f"  pid {p.row['pid']}: {what} +{rate}/s since {_clock(sp['since'])} "
                         f"(flagged {_clock(sp['flagged'])}){cleared}")
    done = [(p, a) for p in s.processes for a in p.attaches]
    if done:
        lines += ["", "attaches"]
        for p, a in done:
            if a["run_file"] is None:
                lines.append(f"  pid {p.row['pid']}: not attached: {shown(a['error'], 200)}")
                continue
            if a["leak_verdict"] == "leak":
                held = f" held by {shown(a['held_by'])}" if a["held_by"] else ""
                site = f", stored at {shown(a['site'])}" if a["site"] else ""
                verdict = f"leak +{human_bytes(a['bytes_per_step'])}/step{held}{site}"
            elif a["leak_verdict"] == "ok":
                verdict = "no leak in the tensors it recorded"
            elif a["error"]:
                verdict = f"failed: {shown(a['error'], 200)}"
            elif a["ended"] is None:
                verdict = "still recording"
            else:
                verdict = a["leak_verdict"] or f"exit {a['exit_code']}"
            lines.append(f"  pid {p.row['pid']} {_clock(a['started'])}-{_clock(a['ended'])}: {verdict}")
            lines.append(f"    {shown(a['run_file'], 200)}")
    return "\n".join(lines)


def _gpu(value: int | None) -> str:
    return "-" if value is None else human_bytes(value)
