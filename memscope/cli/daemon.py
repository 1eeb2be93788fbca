"""``memscope daemon``: watch every PyTorch process of this host, headless, into a node file."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import signal
import sys
import threading

from memscope.cli.common_options import output_flags
from memscope.cli.errors import CliError
from memscope.cli.progress import info
from memscope.display import safe_lines
from memscope.node.daemon import Daemon, DaemonOptions
from memscope.node.nodefile import default_node_path

HELP = ("watch every PyTorch process of this host headless: a node file, leak suspects, Prometheus "
        "metrics, the deep agent on a suspect")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(*output_flags("--db"), dest="db", metavar="NODE.db",
                        help="node file to write, or to continue (default: memscope-node-<host>.db here)")
    parser.add_argument("--interval", type=float, default=5.0, metavar="S",
                        help="seconds between samples (default %(default)s)")
    parser.add_argument("--window", type=float, default=600.0, metavar="S",
                        help="leak suspect: memory growing steadily over the last S seconds (default %(default)s)")
    parser.add_argument("--prometheus", metavar="[HOST:]PORT",
                        help="serve Prometheus metrics there (HOST defaults to 127.0.0.1; port 0: any free one)")
    parser.add_argument("--auto-attach", action="store_true",
                        help="attach the deep agent to a leak suspect for --attach-steps steps, then detach "
                             "(its own user's processes; every user's as root)")
    parser.add_argument("--attach-steps", type=int, default=100, metavar="N",
                        help="steps an automatic attach records (default %(default)s)")
    parser.add_argument("--match", metavar="REGEX",
                        help="watch only the torch processes whose command line matches REGEX (Python re.search)")
    parser.add_argument("--attach-dir", metavar="DIR",
                        help="where automatic attaches write their run files (default: beside the node file)")


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0 or args.window <= 0:
        raise CliError("daemon: --interval and --window must be positive numbers of seconds")
    if args.attach_steps <= 0:
        raise CliError("daemon: --attach-steps must be a positive number of steps")
    if (args.attach_dir is not None or args.attach_steps != 100) and not args.auto_attach:
        raise CliError("daemon: --attach-steps and --attach-dir go with --auto-attach")
    if args.attach_dir is not None and not os.path.isdir(args.attach_dir):
        raise CliError(f"daemon: --attach-dir {args.attach_dir}: no such directory")
    if args.match is not None:
        try:
            re.compile(args.match)
        except re.error as exc:
            raise CliError(f"daemon: --match {args.match!r}: not a regular expression ({exc})") from None
    prometheus = None
    if args.prometheus is not None:
        from memscope.node.exporter import parse_address

        try:
            prometheus = parse_address(args.prometheus)
        except ValueError as exc:
            raise CliError(f"daemon: --prometheus {exc}") from None
        if importlib.util.find_spec("prometheus_client") is None:
            raise CliError("daemon: --prometheus needs prometheus_client (pip install prometheus-client)")
    options = DaemonOptions(db=args.db or default_node_path(), interval=args.interval, window=args.window,
                            prometheus=prometheus, auto_attach=args.auto_attach, attach_steps=args.attach_steps,
                            attach_dir=args.attach_dir, match=args.match)
    stop = threading.Event()
    interrupted: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        if signum == signal.SIGINT:
            interrupted.append(signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    def say(line: str) -> None:
        print(safe_lines(line), file=sys.stderr, flush=True)

    daemon = Daemon(options, say)
    daemon.run(stop)
    info(safe_lines(f"memscope: daemon stopped after {daemon.samples} samples; its record: {options.db} "
                    f"(memscope report {options.db})"))
    # SIGTERM (a service manager's stop) is a clean end: 0; ^C is an interrupt: 130, as for
    # every command (the node file is closed the same way)
    return 130 if interrupted else 0
