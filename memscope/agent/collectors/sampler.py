"""The sampler (a job of the agent's one thread) and the per-step peak bookkeeping it shares with step boundaries."""

from __future__ import annotations

import os
import resource
import sys
import threading
from typing import Callable


def rss_high_water_mark() -> int:
    """Peak RSS of this process since it started, in bytes (monotonic; never reset by us:
    resetting it through /proc/self/clear_refs would change what the user's own
    ``getrusage`` reports)."""
    kib_or_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(kib_or_bytes if sys.platform == "darwin" else kib_or_bytes * 1024)


class RssReader:
    """This process's RSS now, from ``/proc/<pid>/statm`` through one open descriptor: a few µs,
    where psutil's ``memory_info()`` opens and parses the file each call (about 20 µs, at every
    step boundary and sample: 2% of a 1 ms step). Reopened in a forked child (the inherited
    descriptor reads the parent); psutil where there is no /proc."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._pid = 0
        self._lock = threading.Lock()
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def __call__(self) -> int:
        return self.rss_vms()[0]

    def rss_vms(self) -> tuple[int, int]:
        """(resident, virtual) bytes."""
        try:
            fd = self._fd
            if fd is None or self._pid != os.getpid():
                fd = self._open()
            fields = os.pread(fd, 256, 0).split()
            return int(fields[1]) * self._page, int(fields[0]) * self._page
        except Exception:
            import psutil

            info = psutil.Process().memory_info()
            return int(info.rss), int(info.vms)

    def _open(self) -> int:
        with self._lock:
            pid = os.getpid()
            if self._fd is None or self._pid != pid:
                if self._fd is not None and self._pid == pid:
                    os.close(self._fd)
                self._fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                self._pid = pid
            return self._fd

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is not None and self._pid == os.getpid():
                os.close(fd)


class StepPeak:
    """Peak of one quantity within the current step.

    Sampled values alone miss short spikes between samples. A monotonic high-water mark (peak
    RSS, or the allocator's ``allocated_bytes.all.peak``) closes the gap: when it rose during
    the step, the step's peak *is* the new mark, exactly. Otherwise the step stayed below an
    earlier peak and the largest sampled value is the estimate.
    """

    def __init__(self, high_water: int | None, current: int = 0) -> None:
        self.high_water = high_water
        self.largest = current

    def observe(self, current: int | None) -> None:
        if current is not None and current > self.largest:
            self.largest = current

    def close(self, high_water: int | None, current: int | None) -> int:
        self.observe(current)
        peak = self.largest
        if high_water is not None and self.high_water is not None and high_water > self.high_water:
            # max(): the kernel's RSS counters are batched per thread, so the mark can read a
            # few hundred KiB under a sample taken moments before
            peak = max(high_water, peak)
        self.high_water = high_water
        self.largest = current or 0
        return peak


class Sampler:
    """Calls ``tick`` at a fixed rate as a job of the agent's one thread
    (:class:`memscope.turns.TurnThread`), never a thread of its own: each thread costs the
    process a stack and a malloc arena (64 MiB of address space under glibc), which a training
    under ``ulimit -v`` may need. A failing tick stops the sampling (``on_error`` says why)."""

    def __init__(self, hz: float, tick: Callable[[], None],
                 on_error: Callable[[BaseException], None]) -> None:
        self.interval = 1.0 / hz
        self._tick: Callable[[], None] | None = tick
        self._on_error = on_error

    def __call__(self) -> float | None:
        """One turn: a sample; the seconds until the next, or None once sampling stopped."""
        tick = self._tick
        if tick is None:
            return None
        try:
            tick()
        except BaseException as exc:  # noqa: BLE001 - report and stop, never raise into the process
            self._tick = None
            self._on_error(exc)
            return None
        return self.interval

    def stop(self) -> None:
        """No tick after the one running now, if any."""
        self._tick = None
