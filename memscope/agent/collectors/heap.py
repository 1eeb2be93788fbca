"""The bytes glibc's malloc has handed out and not taken back (``mallinfo2``), read at each
tensor inventory so the readers can measure what a retained autograd node costs on this run
(C++ nodes live on the host heap, in CUDA runs too) instead of assuming a size; and the free
bytes its arenas keep, so that host memory a healthy run's heap holds on to (fragmentation while
it warms up) is not taken for growth, nor a leak that reuses them for none.

``None`` where it cannot be read (not glibc >= 2.33: musl, macOS, Windows)."""

from __future__ import annotations

import ctypes
from typing import Any

_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
           "fordblks", "keepcost")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


_fn: Any = None
_looked = False


def _mallinfo2() -> Any:
    global _fn, _looked
    if not _looked:
        _looked = True
        try:
            # the process's own symbols (libc's among them): ctypes.util.find_library("c") would
            # run ldconfig (or a compiler) as a child of the training, 10 ms at the first inventory
            libc = ctypes.CDLL(None)
            fn = libc.mallinfo2  # AttributeError before glibc 2.33 (mallinfo's ints wrap at 2 GiB)
            fn.restype = _MallInfo2
            fn.argtypes = []
            _fn = fn
        except (OSError, AttributeError):
            _fn = None
    return _fn


def malloc_in_use() -> int | None:
    """Heap chunks in use plus mmapped chunks: every byte malloc has handed out and not freed."""
    reading = malloc_reading()
    return None if reading is None else reading[0]


def malloc_reading() -> tuple[int, int] | None:
    """(bytes in use as :func:`malloc_in_use`, free bytes malloc's arenas keep), one reading."""
    fn = _mallinfo2()
    if fn is None:
        return None
    try:
        info = fn()
    except Exception:
        return None
    return int(info.uordblks + info.hblkhd), int(info.fordblks)
