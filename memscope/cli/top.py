"""``memscope top``: every process of this host with torch loaded, live (or sampled once)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

from memscope.cli.errors import CliError
from memscope.cli.progress import update
from memscope.display import shown
from memscope.node.monitor import Monitor, Snapshot
from memscope.units import human_bytes

HELP = "every PyTorch process of this host: memory, its growth, GPU memory, recorded or not (live view)"
LIVE_WINDOW_S = 120.0
ONCE_WINDOW_S = 10.0
SAMPLES_PER_WINDOW = 40  # --once: samples in the window (the growth rule needs 16 or more)


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--once", action="store_true",
                        help="sample for --window seconds, print the processes once and exit (for scripts)")
    parser.add_argument("--json", action="store_true", help="with --once: print the memscope.top/1 JSON document")
    parser.add_argument("--window", type=float, default=None, metavar="S",
                        help=f"growth over the last S seconds (default {LIVE_WINDOW_S:g}; with --once, "
                             f"{ONCE_WINDOW_S:g}, and --once samples that long)")
    parser.add_argument("--interval", type=float, default=None, metavar="S",
                        help=f"seconds between samples (default 1; with --once, the window / {SAMPLES_PER_WINDOW})")


def run(args: argparse.Namespace) -> int:
    window = args.window if args.window is not None else (ONCE_WINDOW_S if args.once else LIVE_WINDOW_S)
    if window <= 0:
        raise CliError("top: --window must be a positive number of seconds")
    interval = args.interval if args.interval is not None else (
        max(window / SAMPLES_PER_WINDOW, 0.05) if args.once else 1.0)
    if interval <= 0:
        raise CliError("top: --interval must be a positive number of seconds")
    if args.json and not args.once:
        raise CliError("top: --json goes with --once (the live view is for a terminal)")
    if args.once:
        update(f"sampling every {interval:g} s for {window:g} s")
        snap = sample_window(window, interval)
        print(json.dumps(snap.as_json(), indent=2) if args.json else render_table(snap))
        return 0
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise CliError("top: the live view needs a terminal; use --once (and --json) in scripts")
    from memscope.cli import dashboard_deps

    lacking = dashboard_deps.missing()
    if lacking:
        raise CliError(lacking)
    top = importlib.import_module("memscope_tui.top")
    return int(top.run_top(window=window, interval=interval))


def sample_window(window: float, interval: float) -> Snapshot:
    """Sample every ``interval`` seconds for ``window`` seconds; the last sample (growth over all)."""
    monitor = Monitor(window)
    try:
        end = time.monotonic() + window
        snap = monitor.sample()
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return snap
            time.sleep(min(interval, left))
            snap = monitor.sample()
    finally:
        monitor.close()


def render_table(snap: Snapshot) -> str:
    """The --once text: one line per process, most growth first."""
    lines = [f"{len(snap.processes)} torch process{'es' if len(snap.processes) != 1 else ''} on "
             f"{shown(snap.host)}; growth over {snap.window_s:g} s"
             + (f"; GPU: {snap.gpu_why}" if snap.gpu_why else "")]
    lines.append(f"  {'PID':>7}  {'USER':<8} {'RSS':>10} {'GROWTH':>12} {'GPU':>10}  {'RECORDED':<24} COMMAND")
    for p in sorted(snap.processes, key=lambda p: (-p.growth_bytes_per_s, p.pid)):
        growth = f"+{human_bytes(p.growth_bytes_per_s)}/s" if p.growth_bytes_per_s >= 1 else "0"
        gpu = "-" if p.gpu_bytes is None else human_bytes(p.gpu_bytes)
        rec = "-"
        if p.run_file:
            rec = p.recorded.words if p.recorded is not None else "yes"
        flag = "  growing" if p.growing else ""
        lines.append(f"  {p.pid:>7}  {shown(p.user, 8):<8} {human_bytes(p.host_rss_bytes):>10} {growth:>12} "
                     f"{gpu:>10}  {shown(rec, 24):<24} {shown(p.command, 200)}{flag}")
    for u in snap.unreadable:
        lines.append(f"  {u.pid:>7}  {shown(u.user, 8):<8} {shown(u.command, 50)}: {u.why}")
    return "\n".join(lines)
