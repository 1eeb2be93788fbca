"""Every file memscope writes for the user, written one safe way (docs/files.md lists them).

* New files are created exclusively (``O_CREAT|O_EXCL|O_NOFOLLOW``): never an existing file,
  never through a symbolic link; 0600 whatever the umask (0640 when the user asks for group
  read), set on the descriptor before a byte is written.
* An output (an export, an HTML page, a copy) is written to a new temporary file beside its
  name (``tempfile.mkstemp``: exclusive, 0600) and renamed into place only over a regular file
  or nothing: a half-written output never appears under its name, and a device node or a FIFO
  is never replaced (``report --html /dev/null`` as root replaced the machine's /dev/null).
* A device, a FIFO or ``-`` (stdout) the user named is written through (opened without
  ``O_CREAT``); at a name memscope chose itself (an export's per-table files) only a regular
  file or nothing is written, anything else is refused with one line.
* A symbolic link the user named is followed on purpose, once: its target is written by the same
  procedure, and the "wrote" line says so. A link at a name memscope chose is refused.

Standard library only, no memscope import above the floor: the agent's fake runs use it too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from typing import IO, Any, Iterator

from memscope.errors import UserError

PRIVATE = 0o600
GROUP_READABLE = 0o640
_NEW = os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class UnsafeOutput(UserError):
    """An output memscope will not write (one line: the path and why)."""


def file_mode(group_readable: bool = False) -> int:
    """0600, or 0640 when the user asked for group read (``--group-readable``)."""
    return GROUP_READABLE if group_readable else PRIVATE


def create_new(path: str, mode: int = PRIVATE, flags: int = os.O_WRONLY) -> int:
    """A new file at ``path`` (FileExistsError when anything is there, a symbolic link too),
    ``mode`` exactly; its descriptor."""
    fd = os.open(path, flags | _NEW, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits away (0640 under 077), or none
    except BaseException:
        os.close(fd)
        raise
    return fd


def new_temp(directory: str, name: str, mode: int = PRIVATE) -> tuple[int, str]:
    """A new temporary file in ``directory`` for the output ``name``: (descriptor, path)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory or ".")
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        _remove(tmp)
        raise
    return fd, tmp


@dataclass(frozen=True)
class Target:
    """Where an output goes: ``how`` is ``stdout``, ``through`` (a device or FIFO, opened as it
    is) or ``replace`` (a temporary file renamed over nothing or a regular file); ``path`` the
    file written (a symbolic link's target), ``named`` the name given, ``via`` the link followed."""

    how: str
    path: str
    named: str
    via: str | None = None

    @property
    def shown(self) -> str:
        """The output's name for the "wrote ..." line: the link and what it points to."""
        if self.how == "stdout":
            return "stdout"
        if self.via is not None:
            return f"{self.path} (through the symbolic link {self.via})"
        return self.path


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def target(path: str, what: str = "", named: bool = True) -> Target:
    """Where writing ``path`` goes, or UnsafeOutput (one line). ``named``: the user gave this
    path (a link is followed, a device or FIFO written through); else memscope chose it."""
    where = f"{what} {path}".strip()
    if path == "-" and named:
        return Target("stdout", "-", path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        _parent_ok(path, where)
        return Target("replace", path, path)
    except OSError as exc:
        raise UnsafeOutput(f"{where}: {exc.strerror or exc}") from None
    if stat.S_ISREG(st.st_mode):
        return Target("replace", path, path)
    if stat.S_ISLNK(st.st_mode):
        if not named:
            raise UnsafeOutput(f"{where}: is a symbolic link (to {_readlink(path)}); memscope does "
                               "not write through a link at a name it chose: remove it")
        real = os.path.realpath(path)
        try:
            inner = target(real, what, named=True)
        except UnsafeOutput as exc:
            raise UnsafeOutput(f"{where}: a symbolic link to {real}: {str(exc).split(': ', 1)[-1]}") from None
        return Target(inner.how, inner.path, path, via=path)
    if stat.S_ISDIR(st.st_mode):
        raise UnsafeOutput(f"{where}: is a directory")
    if named and (stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        return Target("through", path, path)
    raise UnsafeOutput(f"{where}: exists and is {_kind(st.st_mode)}; refusing to replace it")


def _parent_ok(path: str, where: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UnsafeOutput(f"{where}: directory {parent} does not exist")


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def put_in_place(tmp: str, final: str, what: str = "") -> None:
    """Rename ``tmp`` to ``final`` when ``final`` is nothing or a regular file (never over a
    device, a FIFO, a link or a directory that appeared meanwhile); ``tmp`` is removed when
    refused or when the rename fails. Nothing there: a hard link, which fails rather than
    replace what appears."""
    try:
        _put_in_place(tmp, final, what)
    except BaseException:
        _remove(tmp)
        raise


def _put_in_place(tmp: str, final: str, what: str) -> None:
    where = f"{what} {final}".strip()
    for _ in range(3):
        try:
            st = os.lstat(final)
        except FileNotFoundError:
            try:
                os.link(tmp, final, follow_symlinks=False)
            except FileExistsError:
                continue  # something appeared: look again
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                    _remove(tmp)
                    raise
                os.replace(tmp, final)  # no hard links on this filesystem
                return
            _remove(tmp)
            return
        if not stat.S_ISREG(st.st_mode):
            _remove(tmp)
            raise UnsafeOutput(f"{where}: became {_kind(st.st_mode)} while it was written; "
                               "refusing to replace it")
        os.replace(tmp, final)
        return
    _remove(tmp)
    raise UnsafeOutput(f"{where}: keeps changing while it is written; not written")


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class Output:
    """``with Output(path, ...) as f:`` writes ``path`` the safe way (the module's doc);
    ``shown`` names what was written, for the "wrote ..." line. An error inside the block, or
    an interrupt, leaves nothing under the name (the temporary file is removed)."""

    def __init__(self, path: str, what: str = "", named: bool = True, group_readable: bool = False,
                 binary: bool = False) -> None:
        self.what = what
        self.target = target(path, what, named)
        self.mode = file_mode(group_readable)
        self.binary = binary
        self._tmp: str | None = None
        self._file: IO[Any] | None = None

    @property
    def shown(self) -> str:
        return self.target.shown

    def __enter__(self) -> Any:  # a text file (TextIO), or a binary one with ``binary``
        t = self.target
        if t.how == "stdout":
            self._file = sys.stdout.buffer if self.binary else sys.stdout
            return self._file
        where = f"{self.what} {t.named}".strip()
        try:
            if t.how == "through":
                fd = os.open(t.path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
                if stat.S_ISREG(os.fstat(fd).st_mode):  # it changed since it was looked at
                    os.close(fd)
                    raise UnsafeOutput(f"{where}: became a regular file; not written through")
            else:
                fd, self._tmp = new_temp(os.path.dirname(os.path.abspath(t.path)),
                                         os.path.basename(t.path), self.mode)
        except OSError as exc:
            raise UnsafeOutput(f"{where}: cannot write ({exc.strerror or exc})") from None
        if self.binary:
            self._file = open(fd, "wb")
        else:
            self._file = open(fd, "w", encoding="utf-8", newline="")
        return self._file

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        f, self._file = self._file, None
        if f is None or self.target.how == "stdout":
            if f is not None:
                f.flush()
            return
        tmp, self._tmp = self._tmp, None
        try:
            f.close()
        except BaseException:
            if tmp is not None:
                _remove(tmp)
            if kind is None:
                raise
            return
        if tmp is None:
            return
        if kind is not None:
            _remove(tmp)
            return
        put_in_place(tmp, self.target.path, self.what)


@contextlib.contextmanager
def output(path: str, what: str = "", named: bool = True, group_readable: bool = False,
           binary: bool = False) -> Iterator[Any]:
    """:class:`Output` as a plain context manager (when the caller needs no ``shown``)."""
    with Output(path, what, named, group_readable, binary) as f:
        yield f


def write_new(path: str, data: bytes, mode: int = PRIVATE) -> None:
    """``data`` into a file created at ``path`` (FileExistsError when anything is there)."""
    fd = create_new(path, mode)
    with open(fd, "wb") as f:
        f.write(data)


def replace_new(path: str, mode: int = PRIVATE) -> int:
    """A descriptor of a new file at ``path``, a name memscope chose (a log a child process
    writes into): a regular file there is removed first, anything else refused (UnsafeOutput);
    then created exclusively, so a file that appears meanwhile is an error, never written."""
    if target(path, named=False).how == "replace" and os.path.lexists(path):
        os.remove(path)
    return create_new(path, mode)


def make_dir(path: str, group_readable: bool = False) -> None:
    """A directory memscope creates for the user's files (0700, or 0750 for group read, whatever
    the umask); one that exists is kept as it is."""
    mode = 0o750 if group_readable else 0o700
    try:
        os.makedirs(path, mode)
    except FileExistsError:
        if os.path.isdir(path):
            return
        raise
    os.chmod(path, mode)  # (the umask took bits away)
