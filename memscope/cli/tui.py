"""``memscope tui RUN.db``: the dashboard (``memscope_tui``; textual is the ``tui`` extra's).

Also the foreground dashboard of ``memscope attach`` (:class:`Foreground`): the dashboard runs
as a second process on the terminal while the supervisor waits for the training exactly as it
does headless, so the supervisor's signal handling is unchanged. memscope itself never imports
textual: the dashboard process does.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import os
import signal
import subprocess
import sys
import threading
from typing import BinaryIO

from memscope.cli import dashboard_deps
from memscope.cli.errors import CliError
from memscope.cli.progress import is_quiet
from memscope.store.reader import RunReader

HELP = 'open the terminal dashboard on a run file (needs textual: pip install "torch-memscope[tui]")'


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("db", metavar="RUN.db", help="run file, finished or still being written (or a node "
                        "file of memscope daemon: the top view of what it saw)")
    # set by `memscope attach`: q leaves the training running, ctrl+c interrupts it
    parser.add_argument("--attached", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--attached-pid", action="store_true", help=argparse.SUPPRESS)  # attach --pid


def needs_terminal(command: str, instead: str) -> None:
    """A dashboard draws on a terminal and reads its keys: refuse (one line, exit 2) when stdout
    or stdin is not one, rather than write escape codes into a file and never end."""
    for name, stream in (("stdout", sys.stdout), ("stdin", sys.stdin)):
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        if not tty:
            raise CliError(f"{command}: the dashboard needs a terminal and {name} is not one; {instead}")


def run(args: argparse.Namespace) -> int:
    from memscope.node.nodefile import is_node_file

    lacking = dashboard_deps.missing()
    if is_node_file(args.db):  # a daemon's node file: the top view, on what it saw
        from memscope.node.nodereader import NodeReader

        NodeReader(args.db).close()  # a bad file fails here with one line
        if lacking:
            raise CliError(lacking)
        needs_terminal("tui", f"for text: memscope report {args.db}")
        top = importlib.import_module("memscope_tui.top")
        return int(top.run_top_file(args.db))
    RunReader(args.db).close()  # a bad file fails here with one line, before any UI starts
    if lacking:
        raise CliError(lacking)
    needs_terminal("tui", f"for text: memscope report {args.db}")
    data = importlib.import_module("memscope_tui.data")  # no textual: starts reading at once
    head = data.HeadSource(args.db)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="memscope-read") as pool:
        first = pool.submit(head.read)  # the overview's data, drawn first
        app_module = importlib.import_module("memscope_tui.app")  # textual loads meanwhile
        return int(app_module.run_app(args.db, attached=bool(args.attached or args.attached_pid), first=first,
                                      head=head, by_pid=bool(args.attached_pid)))


# Signals the supervisor collects with sigtimedwait: threads we start must block them too, or a
# signal sent to the process could be delivered to one of them instead (see supervisor._run_linux).
_SUPERVISED = {getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGCHLD")
               if hasattr(signal, name)}


class Foreground:
    """The dashboard on the terminal while ``memscope attach`` supervises the training.

    :meth:`start` spawns ``memscope tui --attached RUN.db`` on the terminal (with SIGINT ignored:
    a ^C to the process group must stop the training, not the dashboard), then points this
    process's stdin at /dev/null and its stdout/stderr at a pipe, so the training (started next,
    inheriting them) cannot scribble over the dashboard. Its output goes to ``log_path``; once
    the dashboard closes it also streams to the terminal again. :meth:`stop` (after the training
    ended) puts the terminal back and waits for the user to close the dashboard.
    """

    def __init__(self, db: str, group_readable: bool = False) -> None:
        self.db = db
        self.log_path = db + ".log"
        self.group_readable = group_readable
        self.tui: subprocess.Popen[bytes] | None = None
        self._saved: dict[int, int] = {}
        self._closed = threading.Event()    # the dashboard process exited
        self._pump: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the dashboard; OSError (UnsafeOutput: a link or a FIFO at RUN.db.log) when the
        training's output has nowhere to go, before anything is started."""
        from memscope.safe_files import file_mode, replace_new

        log = open(replace_new(self.log_path, file_mode(self.group_readable)), "wb")  # memscope's name: made new
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited across exec
        try:
            self.tui = subprocess.Popen([sys.executable, "-m", "memscope", "tui", "--attached", self.db])
        finally:
            signal.signal(signal.SIGINT, previous)
        read_end, write_end = os.pipe()
        for fd in (0, 1, 2):
            self._saved[fd] = os.dup(fd)
        sys.stdout.flush()
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        os.close(write_end)
        masks = hasattr(signal, "pthread_sigmask")
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _SUPERVISED) if masks else set()
        try:  # the threads inherit the blocked mask
            self._pump = threading.Thread(target=self._copy, args=(read_end, log), daemon=True,
                                          name="memscope-output")
            self._pump.start()
            threading.Thread(target=self._watch, daemon=True, name="memscope-dashboard").start()
        finally:
            if masks:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def _watch(self) -> None:
        assert self.tui is not None
        self.tui.wait()
        with self._lock:
            if not self._closed.is_set():
                self._closed.set()
                if self._saved and not is_quiet():  # the training is still going: say so (not with -q)
                    os.write(self._saved[2], (
                        f"memscope: dashboard closed; the training goes on and memscope waits for it "
                        f"to end (^C interrupts it). Its output so far: {self.log_path}\n").encode())

    def _copy(self, fd: int, log: BinaryIO) -> None:
        with log:
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                log.write(chunk)
                log.flush()
                with self._lock:
                    if self._closed.is_set() and self._saved:
                        os.write(self._saved[1], chunk)
        os.close(fd)

    def stop(self) -> None:
        """The training ended: put the terminal back; wait until the user closes the dashboard."""
        with self._lock:
            for fd, saved in self._saved.items():
                os.dup2(saved, fd)
                os.close(saved)
            self._saved.clear()
        if self._pump is not None:
            self._pump.join(timeout=2.0)  # a grandchild may keep the pipe open: do not wait on it
        if self.tui is not None:
            try:
                self.tui.wait()
            except KeyboardInterrupt:
                self.tui.terminate()
                self.tui.wait()
