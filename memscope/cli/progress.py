"""What memscope says on stderr besides its output and its errors.

* :func:`info`: an informational line (``memscope: wrote report.html``); ``-q/--quiet`` silences
  it. Errors and warnings are printed as they are, never through here: ``-q`` never hides them.
* :class:`Progress`: on a terminal (stdout and stderr both a tty, no ``--json``, no ``-q``), one
  line on stderr redrawn in place once a second while a command works (``memscope fit · 12 s:
  fake run 4 (--batch 32, as is)``), from its first second on (a command done sooner shows nothing), and
  erased when it ends. Piped, or with ``--json``, nothing is added. Code below the CLI (runners,
  store, report) never prints: it is handed :meth:`Progress.update` as a callback and says what
  it is doing; the line adds the elapsed time.

While a progress line is drawn, every write to ``sys.stdout`` or ``sys.stderr`` (the command's
output, an info line, a warning) first erases it; the command's output on stdout ends the
progress line for good (nothing is drawn under the output).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TextIO

from memscope.display import shown_text

FIRST_S = 1.0  # nothing is drawn before a command has run this long
EVERY_S = 1.0  # then the line is redrawn this often
_CLEAR = "\r\033[K"  # back to the line's start, erase to its end (cursor control: no colour)

_quiet = False
_active: Progress | None = None


def set_quiet(quiet: bool) -> None:
    """``-q/--quiet``: no informational lines, no progress (set by main for each command)."""
    global _quiet
    _quiet = bool(quiet)


def is_quiet() -> bool:
    return _quiet


def info(line: str) -> None:
    """An informational line on stderr (not an error, not a warning), unless ``-q``."""
    if not _quiet:
        print(line, file=sys.stderr, flush=True)


def _tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def wanted(json_output: bool = False) -> bool:
    """Whether a progress line may be drawn: on a terminal, without ``--json`` or ``-q``."""
    return not _quiet and not json_output and _tty(sys.stdout) and _tty(sys.stderr)


def update(text: str) -> None:
    """Say what the running command does now (nothing when no progress line is shown): the
    callback handed to code below the CLI."""
    if _active is not None:
        _active.update(text)


def callback() -> Callable[[str], None] | None:
    """:func:`update` while a progress line may be drawn, else None (the callee skips the work
    of saying what it does)."""
    return update if _active is not None else None


class _Erasing:
    """A stream that erases the progress line before anything is written to it."""

    def __init__(self, target: TextIO, progress: Progress, ends: bool) -> None:
        self._target = target
        self._progress = progress
        self._ends = ends  # stdout: the command's output ends the progress line for good

    def write(self, s: str) -> int:
        if s:
            self._progress.erase(stop=self._ends)
        return self._target.write(s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


class Progress:
    """One line on ``stream`` (stderr), redrawn every ``every`` seconds from ``first_after`` on,
    by a thread of its own (a step that blocks, a fake run or a child process, still shows its
    time going by). Use as a context manager; :meth:`update` sets what it says."""

    def __init__(self, label: str, stream: TextIO | None = None, first_after: float = FIRST_S,
                 every: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.stream: TextIO = stream if stream is not None else sys.stderr
        self.first_after, self.every, self.clock = first_after, every, clock
        self.text = ""
        self.draws = 0  # lines drawn (tests)
        self._started = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._shown = False     # a line is on the terminal now
        self._ended = False     # output came: draw no more
        self._thread: threading.Thread | None = None
        self._saved: tuple[Any, Any] | None = None

    def update(self, text: str) -> None:
        self.text = text

    def __enter__(self) -> Progress:
        global _active
        self._started = self.clock()
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = _Erasing(sys.stdout, self, ends=True)
        sys.stderr = _Erasing(sys.stderr, self, ends=False)
        self._thread = threading.Thread(target=self._run, name="memscope-progress", daemon=True)
        self._thread.start()
        _active = self
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        _active = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.erase(stop=True)
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved

    def _run(self) -> None:
        if self._stop.wait(self.first_after):
            return
        while True:
            self._draw()
            if self._stop.wait(self.every):
                return

    def _line(self) -> str:
        seconds = self.clock() - self._started
        what = f": {shown_text(self.text)}" if self.text else ""
        line = f"{self.label} · {seconds:.0f} s{what}"  # the time first: a cut line keeps it
        try:
            width = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            width = 0
        width = width or 80  # a terminal that says 0 columns (a fresh pty) is taken as 80
        # one line of the terminal, never wrapped: a wrapped line cannot be erased in place
        return line if len(line) < width else line[:max(width - 2, 1)] + "…"

    def _draw(self) -> None:
        with self._lock:
            if self._ended:
                return
            try:
                self.stream.write(_CLEAR + self._line())
                self.stream.flush()
            except (OSError, ValueError):  # the terminal went away: no more lines
                self._ended = True
                return
            self._shown = True
            self.draws += 1

    def erase(self, stop: bool = False) -> None:
        """Erase the line if it is shown; ``stop``: draw no more."""
        with self._lock:
            if stop:
                self._ended = True
            if self._shown:
                try:
                    self.stream.write(_CLEAR)
                    self.stream.flush()
                except (OSError, ValueError):
                    pass
                self._shown = False


@contextmanager
def running(label: str, enabled: bool) -> Iterator[None]:
    """A progress line for a command while it runs, when ``enabled``."""
    if not enabled:
        yield
        return
    with Progress(label):
        yield
