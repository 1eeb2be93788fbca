"""Run and process rows: created once, finished once, outside the hot path.

A run file is created here and nowhere else (attach, ``attach --pid``, the Python API, merge,
import): exclusively (``O_CREAT|O_EXCL|O_NOFOLLOW``, 0600 or 0640 for group read) before SQLite
opens it, so of two processes creating one path one wins and the other says who holds it; and
removed only by the process that created it (its st_dev/st_ino checked first).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import stat
import time
from typing import Any, Sequence

from memscope import __version__
from memscope.redact import DEFAULT as DEFAULT_REDACTION, Redaction
from memscope.safe_files import create_new, file_mode
from memscope.store import reserve, spill
from memscope.store.schema import APPLICATION_ID, RunFileError
from memscope.store.writer import close_for_copy, connect_rw

FileId = tuple[int, int]  # (st_dev, st_ino)
# Test-only: seconds to wait between the checks of prepare_path and the exclusive create, so a
# test can make two creators race for real (tests/test_files_race.py). Never set it otherwise.
TEST_CREATE_DELAY_ENV = "MEMSCOPE_TEST_CREATE_DELAY"
_HOLDER_WAIT_S = 2.0  # how long the loser of a race waits for the winner's run row (its pid)
_DEFAULT_NAME_TRIES = 20


class RunFileTaken(RunFileError):
    """Another process created the run file first (or something appeared at its path)."""


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


def claim(path: str, group_readable: bool = False) -> FileId:
    """Create an empty file at ``path`` for SQLite to make a run file of: exclusively, never
    through a link, 0600 (0640 with ``group_readable``) whatever the umask. Its (st_dev,
    st_ino); RunFileTaken when anything is there already (another process won a race: the
    message says which pid), RunFileError for any other failure."""
    delay = os.environ.get(TEST_CREATE_DELAY_ENV)
    if delay:  # test-only: widen the window between prepare_path's checks and this create
        time.sleep(float(delay))
    try:
        fd = create_new(path, file_mode(group_readable))
    except FileExistsError:
        raise RunFileTaken(f"{path}: {holder(path)}") from None
    except OSError as exc:
        raise RunFileError(f"{path}: cannot create run file ({_reason(exc)})") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_dev, st.st_ino


def holder(path: str, wait: float = _HOLDER_WAIT_S) -> str:
    """Who made the file at ``path`` that was not there a moment ago: the pid its run row
    names (the winner writes it right after creating the file), or a process holding it open."""
    if os.path.islink(path):
        return "a symbolic link appeared at this path while the run file was being created; not followed"
    deadline = time.monotonic() + wait
    while True:
        pid = _owner_pid(path) if _may_become_run(path) else None
        if pid is not None:
            return (f"created at the same moment by another memscope (pid {pid}), which records "
                    "its run there; choose another path")
        if time.monotonic() >= deadline or not _may_become_run(path):
            break
        time.sleep(0.05)
    pids = _pids_holding(path)
    if pids:
        return (f"created at the same moment by another process (pid {', '.join(map(str, pids))}); "
                "choose another path")
    return "created at the same moment by another process; choose another path"


def _may_become_run(path: str) -> bool:
    """A regular file, empty (just made) or an SQLite file: a run row may still come."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        try:
            head = os.read(fd, len(_SQLITE_MAGIC))
        finally:
            os.close(fd)
    except OSError:
        return False
    return not head or head == _SQLITE_MAGIC


def _owner_pid(path: str) -> int | None:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.2)
    except sqlite3.Error:
        return None
    try:
        row = conn.execute("SELECT owner_pid FROM run WHERE id = 1").fetchone()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return int(row[0]) if row and isinstance(row[0], int) else None


def _pids_holding(path: str) -> list[int]:
    """Processes with ``path`` open (those /proc lets this user see), this one excepted."""
    try:
        st = os.stat(path)
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    except OSError:
        return []
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                fst = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (fst.st_dev, fst.st_ino) == (st.st_dev, st.st_ino):
                found.append(pid)
                break
    return found


def create_run(path: str, command: list[str], started: float | None = None,
               group_readable: bool = False, redaction: Redaction = DEFAULT_REDACTION) -> FileId:
    """Create the run file with its single run row (status ``running``); its (st_dev, st_ino).
    The command is stored as ``redaction`` says (by default: secrets replaced by ``***``,
    memscope/redact.py).

    The file is made exclusively first (:func:`claim`: RunFileTaken when another process got
    there first). On failure nothing this call made is left behind and the error says what
    SQLite or the system said (disk full...)."""
    created = claim(path, group_readable)
    try:
        if file_id(path) != created:  # (a directory this user cannot keep others out of)
            raise RunFileError(f"{path}: replaced by another file while it was being created")
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
        _discard(path, created)
        raise RunFileError(f"{path}: cannot create run file ({_reason(exc)})") from None
    except BaseException:
        _discard(path, created)
        raise
    return created


def new_run(path: str | None, command: Sequence[str], shown: list[str], force: bool = False,
            force_word: str = "--force", group_readable: bool = False,
            started: float | None = None,
            redaction: Redaction = DEFAULT_REDACTION) -> tuple[str, FileId]:
    """Prepare and create a run file: at ``path`` (today's refusals, ``force`` as
    :func:`prepare_path` says), or with None at a default name (:func:`default_db_path`) that
    moves to another, unpredictable one when it is taken, a race lost included. The path and
    the file's (st_dev, st_ino)."""
    if path is not None:
        prepare_path(path, force, force_word)
        return path, create_run(path, shown, started, group_readable, redaction)
    for _ in range(_DEFAULT_NAME_TRIES):
        chosen = default_db_path(list(command))
        try:
            prepare_path(chosen, False, force_word)
            return chosen, create_run(chosen, shown, started, group_readable, redaction)
        except RunFileTaken:
            continue  # taken between the choice and the create: another name
    raise RunFileError(f"{chosen}: no free run-file name after {_DEFAULT_NAME_TRIES} tries; give one")


def discard_run(path: str, created: FileId | None) -> None:
    """Remove a run file this process created (``created``: its (st_dev, st_ino) from
    :func:`create_run`), with its -wal/-shm and the spill files it records: one that recorded
    nothing, or was half written. A file that is not that one (replaced meanwhile) is left."""
    _discard(path, created)


def _discard(path: str, created: FileId | None) -> None:
    if created is None or file_id(path, follow=False) != created:
        return  # not the file this process made: someone else's
    for sf in _recorded_spills(path):
        sf.remove()
    for suffix in _SIDE_FILES:
        try:
            st = os.lstat(path + suffix)
            if stat.S_ISREG(st.st_mode):
                os.remove(path + suffix)
        except OSError:
            pass
    try:
        os.remove(path)
    except OSError:
        pass


def _recorded_spills(path: str) -> list[spill.SpillFile]:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return []
    try:
        found = [spill.verify(path, rec)[0] for rec in spill.recorded(conn)]
    finally:
        conn.close()
    return [sf for sf in found if sf is not None]


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def register_writer(path: str, info: dict[str, Any],
                    redaction: Redaction = DEFAULT_REDACTION) -> tuple[int, spill.SpillFile | None]:
    """Insert a writing process's row and make its spill file (memscope/store/spill.py), the
    file recorded in the same transaction: its id and the spill file (None when the file could
    not be made: rows that would have waited there are then counted as lost). ``info["argv"]``,
    a list, is stored as ``redaction`` says."""
    info = _redacted(info, redaction)
    conn = connect_rw(path)
    made: spill.SpillFile | None = None
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            proc = _insert_process(conn, info)
            try:
                made = spill.SpillFile.create(path, proc)
            except OSError:
                made = None
            if made is not None:
                rec = made.record()
                conn.execute(f"INSERT INTO side_files ({', '.join(rec)}) VALUES ({', '.join('?' for _ in rec)})",
                             tuple(rec.values()))
        return proc, made
    except BaseException:
        if made is not None:
            made.remove()
        raise
    finally:
        conn.close()


def _insert_process(conn: sqlite3.Connection, info: dict[str, Any]) -> int:
    cols = ", ".join(info)  # memscope's own column names
    marks = ", ".join("?" for _ in info)
    cur = conn.execute(f"INSERT INTO processes ({cols}) VALUES ({marks})", tuple(info.values()))
    return int(cur.lastrowid)  # type: ignore[arg-type]


def _redacted(info: dict[str, Any], redaction: Redaction) -> dict[str, Any]:
    info = dict(info)
    if isinstance(info.get("argv"), (list, tuple)):
        info["argv"] = json.dumps(redaction.argv(info["argv"]))
    return info


def register_process(path: str, info: dict[str, Any], redaction: Redaction = DEFAULT_REDACTION) -> int:
    """Insert a process's row that writes nothing more (an import) and return its id.
    ``info["argv"]``, a list, is stored as ``redaction`` says."""
    info = _redacted(info, redaction)
    conn = connect_rw(path)
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            return _insert_process(conn, info)
    finally:
        conn.close()


def finish_run(path: str, exit_code: int | None, signal: int | None,
               ended: float | None = None, status: str | None = None,
               storage: str | None = None, ignored: list[str] | None = None) -> bool:
    """Record how the run ended; mark processes that never said goodbye as lost (with an event
    saying when each was last heard from, and ``storage``: what the supervisor found wrong with
    the disk, if anything); compact. The spill files the run records are replayed first; every
    other file named like one is left alone, named in an event and added to ``ignored``
    (``PATH (why)``) for the caller's warning.

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
                result = spill.replay_all(path, conn)
            except OSError:
                result = spill.Replay()  # unreadable: the rows in it are lost (the writer counted what it could)
            replayed = result.rows
            lost = _silent_agents(conn, ended) + _lost_writers(conn, storage)
            # the room a killed process kept on the disk (memscope/store/reserve.py)
            reserve.remove_left(path, [int(p) for (p,) in conn.execute(
                "SELECT pid FROM processes WHERE status = 'running'") if isinstance(p, int)])
            if replayed:
                lost.append((f"recording recovered at the end of the run: {replayed} rows the "
                             "training could not write (the file was locked or refused writes) "
                             "waited in its spill file and were written then",
                             {"replayed": replayed}))
            lost += _replay_notes(result)
            if ignored is not None:
                ignored += [f"{p} ({why})" for p, why in result.ignored]
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
                    kind = data.pop("kind", None) or (
                        "recording_recovered" if "replayed" in data else "recording_incomplete")
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


def _replay_notes(result: spill.Replay) -> list[tuple[str, dict[str, Any]]]:
    """Events for what replay would not take: files this run did not make, lines that are not
    its rows, a bound reached."""
    out: list[tuple[str, dict[str, Any]]] = []
    if result.ignored:
        names = "; ".join(f"{p} ({why})" for p, why in result.ignored)
        out.append((f"ignored {len(result.ignored)} file(s) beside the run file that this run did "
                    f"not make or that changed (never replayed): {names}",
                    {"kind": "side_files_ignored", "files": [{"path": p, "why": w} for p, w in result.ignored]}))
    if result.refused:
        out.append((f"recording incomplete: {result.refused} line(s) of a spill file were not rows "
                    f"of this run and were not written ({result.refused_why})",
                    {"refused": result.refused, "why": result.refused_why}))
    if result.stopped:
        out.append((f"recording incomplete: {result.stopped}", {"stopped": result.stopped}))
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


def file_id(path: str, follow: bool = True) -> FileId | None:
    """(st_dev, st_ino) of ``path``, or None when it is gone."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
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
    for ``python -m pkg.train``). When anything is at that name or beside it (a file, a link,
    dangling or not, a -wal, a spill file: names anyone can guess and plant), another name with
    a random suffix, ``memscope-<script>-<time>-<8 hex>.db``, that no one can plant ahead."""
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
    while _taken(path):
        path = f"memscope-{stem}-{stamp}-{os.urandom(4).hex()}.db"
    return path


def _taken(path: str) -> bool:
    return any(os.path.lexists(path + s) for s in ("", *_SIDE_FILES)) or bool(spill.spill_files(path))
