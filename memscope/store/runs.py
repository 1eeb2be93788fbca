"""Run and process rows: created once, finished once, outside the hot path."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import stat
import time
from typing import Any

from memscope import __version__
from memscope.redact import DEFAULT as DEFAULT_REDACTION, Redaction
from memscope.store import reserve, spill
from memscope.store.schema import APPLICATION_ID, RunFileError
from memscope.store.writer import close_for_copy, connect_rw


_SIDE_FILES = ("-wal", "-shm", "-journal")
_SQLITE_MAGIC = b"SQLite format 3\x00"


def is_run_file(path: str) -> bool:
    """A regular file whose SQLite header carries memscope's application id."""
    return application_id(path) == APPLICATION_ID


def application_id(path: str) -> int | None:
    """The application id in the SQLite header of the file at ``path`` (None: not SQLite)."""
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError:
        return None
    if len(head) != 100 or not head.startswith(_SQLITE_MAGIC):
        return None
    return int.from_bytes(head[68:72], "big")


def prepare_path(path: str, force: bool, force_word: str = "--force") -> None:
    """Make sure a new run file can be created at ``path``; raise RunFileError with why not.

    ``force`` replaces only what is safe to replace: a memscope run file (with its -wal/-shm)
    or an empty regular file. A symbolic link is refused, dangling or not: SQLite would write
    through it to wherever it points, and the -wal beside the link would not be the target's.
    ``force_word`` is how the caller's user says force in the messages: the CLI's ``--force``,
    the Python API's ``force=True``.
    """
    if os.path.islink(path):
        target = os.readlink(path)
        raise RunFileError(f"{path}: is a symbolic link (to {target}); give the file's own path")
    if os.path.isdir(path):
        raise RunFileError(f"{path}: is a directory; give a file name for the run")
    if os.path.lexists(path):
        if not force:
            raise RunFileError(f"{path}: already exists; pass {force_word} to overwrite it")
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise RunFileError(f"{path}: exists and is not a regular file; refusing to replace it")
        if st.st_size and not is_run_file(path):
            raise RunFileError(f"{path}: exists and is not a memscope run file; refusing to "
                               f"replace it ({force_word} replaces only run files and empty files)")
        live = live_run(path) if st.st_size else None
        if live is not None:
            raise RunFileError(f"{path}: {live}; refusing to replace it, even with {force_word}")
        _remove(path, ("", *_SIDE_FILES))
        _remove_spills(path)
    else:
        orphans = [path + s for s in _SIDE_FILES if os.path.lexists(path + s)] + spill.spill_files(path)
        if orphans:
            if not force:
                raise RunFileError(f"{orphans[0]}: left from an earlier file named {path}; SQLite "
                                   f"would read it into the new run: remove it or pass {force_word}")
            _remove(path, _SIDE_FILES)
            _remove_spills(path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise RunFileError(f"{path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunFileError(f"{path}: directory {parent} is not writable")


def live_run(path: str) -> str | None:
    """Why the run file at ``path`` is still being written (a lock held on it, a run that says
    running with its writer alive or its heartbeat fresh), or None."""
    try:
        conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    except sqlite3.Error:
        return None
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            return "another process holds a lock on it (a run still recording, or a tool)"
    finally:
        conn.close()
    from memscope.store.reader import RunReader  # the reading side, only here

    try:
        with RunReader(path) as reader:
            run = reader.run()
    except Exception:  # noqa: BLE001 - a damaged file is not a live one
        return None
    if run is not None and run["status"] == "running":
        return f"its run is still being recorded (memscope attach pid {run.get('owner_pid')})"
    return None


def _remove_spills(path: str) -> None:
    for p in spill.spill_files(path):
        try:
            os.remove(p)
        except OSError as exc:
            raise RunFileError(f"{p}: cannot remove it ({exc.strerror})") from None


def _remove(path: str, suffixes: tuple[str, ...]) -> None:
    for suffix in suffixes:
        try:
            os.remove(path + suffix)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise RunFileError(f"{path + suffix}: cannot remove it ({exc.strerror})") from None


def create_run(path: str, command: list[str], started: float | None = None,
               redaction: Redaction = DEFAULT_REDACTION) -> None:
    """Create the run file with its single run row (status ``running``), the command stored as
    ``redaction`` says (by default: secrets replaced by ``***``, memscope/redact.py).

    On failure nothing is left behind (the caller checked with :func:`prepare_path` that
    nothing was there) and the error says what SQLite or the system said (disk full...)."""
    try:
        conn = connect_rw(path)
        try:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(
                    "INSERT OR IGNORE INTO run (id, command, cwd, host, memscope_version, started,"
                    " status, owner_pid) VALUES (1, ?, ?, ?, ?, ?, 'running', ?)",
                    (json.dumps(redaction.argv(command)), os.getcwd(), socket.gethostname(), __version__,
                     started or time.time(), os.getpid()),
                )
        finally:
            conn.close()
    except (sqlite3.Error, OSError) as exc:
        _discard(path)
        raise RunFileError(f"{path}: cannot create run file ({_reason(exc)})") from None
    except BaseException:
        _discard(path)
        raise


def discard_run(path: str) -> None:
    """Remove a run file and its side files (one that recorded nothing, or was half written)."""
    _discard(path)


def _discard(path: str) -> None:
    for suffix in ("", *_SIDE_FILES, *(p[len(path):] for p in spill.spill_files(path))):
        try:
            os.remove(path + suffix)
        except OSError:
            pass


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def register_process(path: str, info: dict[str, Any],
                     redaction: Redaction = DEFAULT_REDACTION) -> int:
    """Insert this process's row and return its id (the ``proc`` of every row it writes).
    ``info["argv"]``, a list, is stored as ``redaction`` says."""
    info = dict(info)
    if isinstance(info.get("argv"), (list, tuple)):
        info["argv"] = json.dumps(redaction.argv(info["argv"]))
    conn = connect_rw(path)
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            cols = ", ".join(info)
            marks = ", ".join("?" for _ in info)
            cur = conn.execute(f"INSERT INTO processes ({cols}) VALUES ({marks})", tuple(info.values()))
            return int(cur.lastrowid)  # type: ignore[arg-type]
    finally:
        conn.close()


def finish_run(path: str, exit_code: int | None, signal: int | None,
               ended: float | None = None, status: str | None = None,
               storage: str | None = None) -> bool:
    """Record how the run ended; mark processes that never said goodbye as lost (with an event
    saying when each was last heard from, and ``storage``: what the supervisor found wrong with
    the disk, if anything); compact.

    Returns whether the file is self-contained now (its -wal folded in; False while another
    connection, a dashboard say, still holds it). Raises RunFileError (one line, the cause)
    when the end cannot be recorded: a full disk, a read-only directory, a damaged file."""
    ended = ended or time.time()
    if status is not None:
        pass
    elif signal is not None:
        status = "killed"
    elif exit_code == 0:
        status = "finished"
    else:
        status = "failed"
    try:
        conn = connect_rw(path)
    except (sqlite3.Error, OSError, RunFileError) as exc:
        raise RunFileError(f"{path}: cannot record the end of the run ({_reason(exc)})") from None
    try:
        try:
            # rows the training left in the spill file (the file was locked when it ended)
            try:
                replayed = spill.replay_all(path, conn)
            except OSError:
                replayed = 0  # unreadable: the rows in it are lost (the writer counted what it could)
            lost = _silent_agents(conn, ended) + _lost_writers(conn, storage)
            # the room a killed process kept on the disk (memscope/store/reserve.py)
            reserve.remove_left(path, [int(p) for (p,) in conn.execute(
                "SELECT pid FROM processes WHERE status = 'running'") if isinstance(p, int)])
            if replayed:
                lost.append((f"recording recovered at the end of the run: {replayed} rows the "
                             "training could not write (the file was locked or refused writes) "
                             "waited in its spill file and were written then",
                             {"replayed": replayed}))
            with conn:  # what matters most first: an update of pages the file already has
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(
                    "UPDATE run SET ended = ?, exit_code = ?, signal = ?, status = ? WHERE id = 1",
                    (ended, exit_code, signal, status),
                )
                conn.execute(
                    "UPDATE processes SET status = 'lost', ended = ? WHERE status = 'running'",
                    (ended,),
                )
        except sqlite3.Error as exc:
            raise RunFileError(f"{path}: cannot record the end of the run ({_reason(exc)})") from None
        try:  # then why the record is incomplete, if it is (new rows: may not fit on a full disk)
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                for message, data in lost:
                    kind = "recording_recovered" if "replayed" in data else "recording_incomplete"
                    conn.execute("INSERT INTO events (proc, t, step, kind, message, data)"
                                 " VALUES (?, ?, NULL, ?, ?, ?)",
                                 (data.get("proc"), ended, kind, message, json.dumps(data)))
        except sqlite3.Error:
            pass
        return close_for_copy(conn)
    finally:
        conn.close()


SILENT_AFTER_S = 2.0  # a process row with no write for this long after its start: its agent never ran


def _silent_agents(conn: sqlite3.Connection, ended: float) -> list[tuple[str, dict[str, Any]]]:
    """Processes whose agent registered them and then wrote nothing (no heartbeat after the
    first, no sample, no step) though the run went on: memscope's thread never ran there, and
    the agent could not even say so itself. Said by the supervisor."""
    out: list[tuple[str, dict[str, Any]]] = []
    rows = conn.execute("SELECT id, pid, started, heartbeat FROM processes WHERE status = 'running'"
                        " AND (heartbeat IS NULL OR heartbeat < started + 1.0)").fetchall()
    for proc, pid, started, beat in rows:
        if not isinstance(started, (int, float)) or ended - started < SILENT_AFTER_S:
            continue
        wrote = conn.execute("SELECT EXISTS (SELECT 1 FROM samples WHERE proc = ?) OR EXISTS "
                             "(SELECT 1 FROM steps WHERE proc = ?) OR EXISTS (SELECT 1 FROM events "
                             "WHERE proc = ?)", (proc, proc, proc)).fetchone()[0]
        if not wrote:
            out.append((f"recording of pid {pid} never started: its agent registered the process and "
                        f"wrote nothing after it ({ended - started:.0f} s before the run ended: "
                        "memscope's thread did not run there); that process went on unrecorded",
                        {"proc": proc, "pid": pid, "started": started, "last_heartbeat": beat}))
    return out


def _lost_writers(conn: sqlite3.Connection, storage: str | None) -> list[tuple[str, dict[str, Any]]]:
    """One event per process that never wrote its end: when it was last heard from, and why
    that may be (the disk). A process that ended by a signal never says goodbye either: the
    ``killed`` event tells that story, so this stays quiet unless the disk is the suspect."""
    out: list[tuple[str, dict[str, Any]]] = []
    rows = conn.execute("SELECT id, pid, heartbeat, dropped FROM processes WHERE status = 'running'").fetchall()
    for proc, pid, beat, dropped in rows:
        if storage is None:
            continue
        when = time.strftime("%H:%M:%S", time.localtime(beat)) if isinstance(beat, (int, float)) else "?"
        out.append((f"recording of pid {pid} stopped early: its last write was at {when}; {storage}",
                    {"proc": proc, "pid": pid, "last_heartbeat": beat, "dropped": dropped,
                     "storage": storage}))
    if storage is not None and not out:
        lost = conn.execute("SELECT coalesce(sum(dropped), 0) FROM processes").fetchone()[0]
        if lost:
            out.append((f"recording incomplete ({lost} rows dropped): {storage}",
                        {"storage": storage, "dropped": lost}))
    return out


def add_event(path: str, kind: str, message: str, data: dict[str, Any] | None = None,
              proc: int | None = None, redaction: Redaction = DEFAULT_REDACTION) -> bool:
    """One event written outside any agent (the supervisor, a process memscope does not record);
    best effort: whether it is in the file. A command in ``data`` (``command``, ``argv``: a list)
    is stored as ``redaction`` says."""
    if data is not None:
        data = {k: redaction.argv(v) if k in ("command", "argv") and isinstance(v, (list, tuple)) else v
                for k, v in data.items()}
    try:
        conn = connect_rw(path)
    except (sqlite3.Error, OSError, RunFileError):
        return False
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO events (proc, t, step, kind, message, data) VALUES (?, ?, NULL, ?, ?, ?)",
                         (proc, time.time(), kind, message, json.dumps(data) if data is not None else None))
        return True
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def file_id(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of ``path``, or None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def wait_writable(path: str, on_wait: Any = None, poll: float = 1.0) -> None:
    """Block until the run file takes a write (another process's lock on it has gone);
    ``on_wait()`` is called once, when the first try finds it locked. Other errors return:
    the write that follows says what they are."""
    said = False
    while True:
        try:
            conn = sqlite3.connect(path, timeout=poll, isolation_level=None)
        except sqlite3.Error:
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return
        except sqlite3.Error as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                return
            if not said and on_wait is not None:
                on_wait()
            said = True
        finally:
            conn.close()


def compact(path: str) -> bool:
    """Fold a finished run's -wal into the file (after the last reader let go); best effort."""
    if not os.path.exists(path + "-wal"):
        return True
    try:
        conn = sqlite3.connect(path, timeout=1.0, isolation_level=None)
    except sqlite3.Error:
        return False
    try:
        return close_for_copy(conn)
    finally:
        conn.close()


def default_db_path(command: list[str], now: float | None = None) -> str:
    """``memscope-<script>-<YYYYmmdd-HHMMSS>.db`` in the working directory (the module's name
    for ``python -m pkg.train``)."""
    stem = "run"
    for i, word in enumerate(command):
        base = os.path.basename(word)
        if word == "-m" and i + 1 < len(command) and i > 0:
            stem = command[i + 1]
            break
        if base.endswith(".py"):
            stem = base[:-3]
            break
    else:
        if command:
            stem = os.path.basename(command[0]) or "run"
    stem = "".join(c if c.isalnum() or c in "._-" else "_" for c in stem) or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    path = f"memscope-{stem}-{stamp}.db"
    n = 1
    while os.path.exists(path):
        n += 1
        path = f"memscope-{stem}-{stamp}-{n}.db"
    return path
