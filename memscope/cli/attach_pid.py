"""``memscope attach --pid PID``: record a training that is already running, then detach."""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading

from memscope.cli.errors import CliError
from memscope.cli.progress import info
from memscope.display import safe_lines
from memscope.node import attach_session
from memscope.node.target import TargetError


def _options(args: argparse.Namespace) -> dict[str, object]:
    from memscope.cli.attach import agent_options

    if args.try_techniques or args.simulate_gpu:
        raise CliError("attach: --try and --simulate-gpu change a training from its start: not with --pid")
    try:
        _options_checked, chosen = agent_options(args)
    except ValueError as exc:
        raise CliError(f"attach: {exc}") from None
    chosen.pop("max_steps", None)  # counted from the attach, by the attachment (detach, not exit)
    for key in ("try_techniques", "simulate_gpu"):
        chosen.pop(key, None)
    return chosen


class _Dashboard:
    """The live dashboard in the foreground; closing it (q) asks for a detach."""

    def __init__(self, db: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "memscope", "tui", "--attached-pid", db])
        self.closed = threading.Event()
        threading.Thread(target=self._wait, daemon=True, name="memscope-dashboard").start()

    def _wait(self) -> None:
        self.proc.wait()
        self.closed.set()


def run(args: argparse.Namespace) -> int:
    pid = int(args.pid)
    if args.duration is not None and args.duration <= 0:
        raise CliError("attach: --duration must be a positive number of seconds")
    if args.attach_timeout <= 0:
        raise CliError("attach: --attach-timeout must be a positive number of seconds")
    options = _options(args)
    try:
        from memscope.node.target import inspect

        target = inspect(pid)  # refusals before any file is made
    except TargetError as exc:
        raise CliError(f"attach: {exc}") from None
    del target  # inspected again by attach(), a moment later

    def say(line: str) -> None:  # information: -q hides it
        info(safe_lines(line))

    try:
        session = attach_session.attach(pid, args.db, options, max_steps=args.max_steps, debugger=args.debugger,
                                        timeout=args.attach_timeout, force=args.force,
                                        group_readable=args.group_readable, say=say)
    except (TargetError, attach_session.AttachError) as exc:
        raise CliError(f"attach: {exc}") from None
    db = session.db
    say(f"memscope: attached to pid {pid} in {session.seconds_to_agent:.1f} s; recording into {db} "
        f"(detach: ^C, memscope detach {pid}{', --duration' if args.duration else ''})")
    interrupted = attach_session.interrupt_counter()
    dashboard = None
    if not args.headless and sys.stdout.isatty() and sys.stdin.isatty():
        from memscope.cli.dashboard_deps import missing

        lacking = missing()
        if lacking is None:
            dashboard = _Dashboard(db)
        else:
            # a warning, as attach's: the dashboard asked for is missing (-q keeps it)
            print(safe_lines(f"memscope: {lacking}; recording headless"), file=sys.stderr, flush=True)
    outcome = attach_session.watch(session, args.duration, interrupted,
                                   on_poll=(dashboard.closed.is_set if dashboard is not None else None))
    attach_session.finish(session, outcome)
    if dashboard is not None:
        dashboard.proc.wait()  # it shows how the recording ended until the user closes it
    said = {"detached": f"detached from pid {pid}; it goes on without memscope",
            "exited": f"pid {pid} ended while attached",
            "lost": f"pid {pid} did not confirm the detach; its agent detaches by itself now that "
                    "this command ends"}[outcome]
    if outcome == "lost":  # a problem: said whatever -q says
        print(safe_lines(f"memscope: warning: {said}"), file=sys.stderr)
    else:
        say(f"memscope: {said}")
    try:
        from memscope.analysis.summary import headline
        from memscope.report.text import render_headless
        from memscope.store.reader import RunReader

        from memscope.cli.attach import say_summary

        with RunReader(db) as reader:
            say_summary(render_headless(headline(reader)))
    except Exception as exc:  # noqa: BLE001 - the recording is in the file whatever the summary does
        print(safe_lines(f"memscope: warning: cannot summarise the run: {' '.join(str(exc).split())}"),
              file=sys.stderr)
    return 0 if outcome != "lost" else 1


HELP = "detach memscope from a process it attached to by pid (memscope attach --pid)"


def register_detach(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=int, help="the process memscope attach --pid recorded")
    parser.add_argument("--timeout", type=float, default=attach_session.DETACH_TIMEOUT_S, metavar="S",
                        help="how long to wait for the agent to confirm (default %(default)s)")


def detach(args: argparse.Namespace) -> int:
    try:
        db = attach_session.detach_pid(args.pid, args.timeout)
    except attach_session.AttachError as exc:
        raise CliError(f"detach: {exc}") from None
    info(f"memscope: detached from pid {args.pid}; its record: {db}")
    return 0


