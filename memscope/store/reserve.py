"""Room kept on the run file's disk for the end of a run that fills it.

When the disk fills up during a run, the rows the training makes from then on have nowhere to
go; what must still reach the file is how many were lost and why, the process's last counts and
the run's end. Those need a few pages too. So each writer keeps a reserve: a file of
``RESERVE_BYTES`` beside the run file (``RUN.db-reserve-PID``: created exclusively, never
through a symlink, 0600, its blocks allocated), removed when the writer closes. On a full disk
the writer removes it at close, writes the waiting rows while more than ``MARGIN_BYTES`` stay
free, counts the rest as lost, and writes that count; the supervisor's end of the run then fits
in the margin. Only the file this writer made is removed (its device and inode).
"""

from __future__ import annotations

import os


def _env_bytes(name: str, default: int) -> int:
    try:
        value = int(os.environ[name])
    except (KeyError, ValueError):
        return default
    return value if value >= 0 else default


RESERVE_BYTES = _env_bytes("MEMSCOPE_RESERVE_BYTES", 512 * 1024)
MARGIN_BYTES = _env_bytes("MEMSCOPE_MARGIN_BYTES", 128 * 1024)  # left free for the accounting and the end


class Reserve:
    def __init__(self, run_path: str) -> None:
        self.path = f"{run_path}-reserve-{os.getpid()}"
        self._id: tuple[int, int] | None = None

    @property
    def held(self) -> bool:
        return self._id is not None

    def make(self, size: int = RESERVE_BYTES) -> bool:
        """Create the reserve (once); False when the disk has no room for it, or a file is there."""
        if self._id is not None or size <= 0:
            return self._id is not None
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError:
            return False
        try:
            try:
                os.posix_fallocate(fd, 0, size)  # blocks allocated, not a sparse file
            except (AttributeError, OSError):
                block = b"\0" * 65536
                for _ in range(0, size, len(block)):
                    os.write(fd, block)
            st = os.fstat(fd)
            self._id = (st.st_dev, st.st_ino)
            return True
        except OSError:
            try:
                os.remove(self.path)
            except OSError:
                pass
            return False
        finally:
            os.close(fd)

    def release(self) -> bool:
        """Remove the reserve this writer made (whatever else is at its name stays); whether
        room was given back."""
        ident, self._id = self._id, None
        if ident is None:
            return False
        try:
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) != ident:
                return False
            os.remove(self.path)
            return True
        except OSError:
            return False


def free_bytes(run_path: str) -> int | None:
    """Bytes an unprivileged writer may still use on the run file's disk (None: unknown)."""
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(run_path)))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def remove_left(run_path: str, pids: list[int]) -> None:
    """The supervisor, at the end of a run: remove the reserves of this run's processes that
    could not remove their own (killed): regular files of this user, at their exact names."""
    for pid in pids:
        path = f"{run_path}-reserve-{pid}"
        try:
            st = os.lstat(path)
            import stat

            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                os.remove(path)
        except OSError:
            pass
