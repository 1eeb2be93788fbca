"""Files of one export written side by side, one "lane" a core: this process writes the files of
the first lane, a child process (``python -m memscope.report.file_lanes``, its own connection to
the run file) each other lane's. The files are shared out biggest first, each to the lane with
the least work so far. Processes, not threads: SQLite makes the text and lets go of Python's
lock, but its allocator's statistics take one mutex per allocation (SQLITE_CONFIG_MEMSTATUS,
on in the usual builds, not settable from Python): two threads spent 75% more CPU than one.

Each file is written to a new temporary file beside its name (``mkstemp``: exclusive, 0600 or
0640, never through a symlink; a child gets its files' descriptors, never a path to open) and
renamed over the name once every lane is done, in the jobs' order, up to the first that failed:
what the export leaves is what writing them one after the other would have left (the files
before the first failure), and that failure is raised. The names are memscope's own (a table's),
so only a regular file or nothing there is replaced: a symbolic link, a FIFO or a device at one
is refused before anything is written (memscope/safe_files.py). On an interrupt the children are
ended and what every lane wrote is removed.
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
from typing import Any, Callable, NamedTuple, TextIO

from memscope.errors import UserError
from memscope.safe_files import file_mode, new_temp, put_in_place, target
from memscope.report.sql_text import lenient_text
from memscope.store.reader import RunReader

MAX_LANES = 4  # the export's big files: the timeline, steps, samples, layer_stats
ONE_LANE_BELOW = 1_000_000  # cells, about a child's start (0.08 CPU s): a smaller export is not shared

Writer = Callable[[RunReader, str, TextIO], int]  # (reader, file name, out) -> data rows


class Job(NamedTuple):
    name: str  # a plain file name inside the directory
    cost: int  # a guess of its work, to share the files out evenly


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def write_files(reader: RunReader, directory: str, jobs: list[Job], writer: str, lanes: int = 0,
                group_readable: bool = False, progress: Callable[[str], None] | None = None) -> dict[str, int]:
    """Write every job's file into ``directory`` with ``writer`` (``module:function``, a
    :data:`Writer`, importable by a child); return {name: data rows}. ``lanes``: 0 one a core
    (at most :data:`MAX_LANES`), 1 one file after the other, in this process (so is a small
    export, under :data:`ONE_LANE_BELOW`). Files 0600 (0640 with ``group_readable``).
    ``progress`` is told how many files are written, as each is."""
    say = progress or (lambda _text: None)
    for job in jobs:
        if os.path.basename(job.name) != job.name or job.name in (".", ".."):  # known tables only; checked anyway
            raise UserError(f"export: refusing to write {job.name!r}: not a plain file name")
        target(os.path.join(directory, job.name), "export:", named=False)  # nothing but a file there
    mode = file_mode(group_readable)
    temps: dict[str, str] = {}
    fds: dict[str, int] = {}  # the descriptors of temporary files no lane has taken yet

    def fresh(name: str) -> int:
        fd, temps[name] = new_temp(directory, name, mode)
        return fd

    renamed: set[str] = set()
    if reader.conn.text_factory not in (str, lenient_text) or sum(j.cost for j in jobs) < ONE_LANE_BELOW:
        lanes = 1  # a child reads as the CLI does; a small export is done before a child starts
    shares = _share(jobs, min(lanes or min(cores(), MAX_LANES), len(jobs)))
    done: dict[str, int | BaseException] = {}
    children: list[subprocess.Popen[bytes] | None] = []
    try:
        stopped: BaseException | None = None
        try:
            for job in jobs:
                fds[job.name] = fresh(job.name)
            lenient = reader.conn.text_factory is lenient_text
            for share in shares[1:]:
                children.append(_start(reader.path, lenient, writer, [(n, fds[n]) for n in share]))
                for given in share:  # the child's now (or, with no child, redone on a new file)
                    os.close(fds.pop(given))
            order = {job.name: i for i, job in enumerate(jobs)}
            failed = len(jobs)  # the first failure's place: the files after it are not needed
            for name in shares[0]:  # this process's lane
                if order[name] < failed:
                    say(f"{len(done)} of {len(jobs)} files written; writing {name}")
                    try:
                        done[name] = _write_fd(reader, fds.pop(name), _writer(writer), name)
                    except Exception as exc:
                        done[name], failed = exc, order[name]
            for child, share in zip(children, shares[1:]):
                say(f"{len(done)} of {len(jobs)} files written; waiting for {', '.join(share)}")
                done.update(_results(child, share, reader, writer, temps, fresh))
        except BaseException as exc:  # a failure here, an interrupt
            stopped = exc
        written: dict[str, int] = {}
        for job in jobs:  # the files before the first failure, as one after the other leaves them
            n = done.get(job.name)
            if not isinstance(n, int):
                raise stopped or n or RuntimeError(f"export: {job.name} was not written")
            put_in_place(temps[job.name], os.path.join(directory, job.name), "export:")
            renamed.add(job.name)
            written[job.name] = n
        if stopped is not None:
            raise stopped
        return written
    finally:
        for child in filter(None, children):  # ended already, unless this process was interrupted
            if child.poll() is None:
                child.kill()
            child.wait()
        for fd in fds.values():
            os.close(fd)
        for name, tmp in temps.items():  # what was not renamed into place
            if name not in renamed:
                _remove(tmp)


def _share(jobs: list[Job], lanes: int) -> list[list[str]]:
    """The jobs' names in ``lanes`` lanes: biggest first, each to the least loaded lane (a
    child's lane starts later: its start counts as work)."""
    shares: list[list[str]] = [[] for _ in range(max(lanes, 1))]
    load = [0] + [ONE_LANE_BELOW] * (len(shares) - 1)
    for job in sorted(jobs, key=lambda job: -job.cost):
        lane = load.index(min(load))
        shares[lane].append(job.name)
        load[lane] += max(job.cost, 1)
    return [s for s in shares if s] or [[]]


def _start(path: str, lenient: bool, writer: str, files: list[tuple[str, int]]) -> subprocess.Popen[bytes] | None:
    # the child imports what this process imported (the same memscope, wherever it came from)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    args = [sys.executable, "-m", __name__, writer, path, "lenient" if lenient else "str"]
    try:
        return subprocess.Popen([*args, *(f"{name}={fd}" for name, fd in files)], env=env,
                                pass_fds=[fd for _, fd in files], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except OSError:  # no interpreter to start (an embedded Python): this process does the share
        return None


def _results(child: subprocess.Popen[bytes] | None, share: list[str], reader: RunReader, writer: str,
             temps: dict[str, str], fresh: Callable[[str], int]) -> dict[str, int | BaseException]:
    """A child's outcome per file; its files written here instead if it could not say (a child
    that did not start, or died)."""
    if child is not None:
        out, _ = child.communicate()
        try:
            results: dict[str, int | BaseException] = pickle.loads(out)  # from our own child
            if child.returncode == 0 and isinstance(results, dict) and set(results) == set(share):
                return results
        except Exception:
            pass
    redone: dict[str, int | BaseException] = {}
    for name in share:
        _remove(temps[name])
        try:
            redone[name] = _write_fd(reader, fresh(name), _writer(writer), name)
        except Exception as exc:  # raised if it is the first failure in the jobs' order
            redone[name] = exc
    return redone


def _writer(writer: str) -> Writer:
    module, _, function = writer.partition(":")
    found: Writer = getattr(importlib.import_module(module), function)
    return found


def _write_fd(reader: RunReader, fd: int, write: Writer, name: str) -> int:
    """``write`` ``name`` into the new temporary file open at ``fd`` (closed after)."""
    with open(fd, "w", newline="", encoding="utf-8") as f:
        return write(reader, name, f)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _lane(argv: list[str]) -> int:
    """A child's lane: ``WRITER RUN.db lenient|str NAME=FD...`` (FD: the descriptor of the
    file's new temporary file, passed by the parent); every file's data rows or exception,
    pickled to stdout."""
    writer, path, text, *files = argv
    results: dict[str, Any] = {}
    try:
        with RunReader(path) as reader:
            if text == "lenient":
                reader.conn.text_factory = lenient_text
            for name, _, fd in (f.partition("=") for f in files):
                try:
                    results[name] = _write_fd(reader, int(fd), _writer(writer), name)
                except Exception as exc:
                    results[name] = exc
    except KeyboardInterrupt:  # the terminal's, with the parent's: it ends this lane
        return 130
    except Exception as exc:  # the file cannot be opened: each file says so
        results = {name: exc for name, _, _ in (f.partition("=") for f in files)}
    sys.stdout.buffer.write(pickle.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(_lane(sys.argv[1:]))
