"""The sampler thread and the per-step peak bookkeeping it shares with step boundaries."""

from __future__ import annotations

import resource
import sys
import threading
from typing import Callable

from memscope.quiet_thread import QuietThread


def rss_high_water_mark() -> int:
    """Peak RSS of this process since it started, in bytes (monotonic; never reset by us:
    resetting it through /proc/self/clear_refs would change what the user's own
    ``getrusage`` reports)."""
    kib_or_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(kib_or_bytes if sys.platform == "darwin" else kib_or_bytes * 1024)


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


class SamplerThread:
    """Calls ``tick`` at a fixed rate until stopped; a failing tick stops the thread."""

    def __init__(self, hz: float, tick: Callable[[], None],
                 on_error: Callable[[BaseException], None]) -> None:
        self._interval = 1.0 / hz
        self._tick = tick
        self._on_error = on_error
        self._stop = threading.Event()
        self._thread = QuietThread(target=self._run, name="memscope-sampler")

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._tick()
            except BaseException as exc:  # noqa: BLE001 - report and stop, never raise into the process
                self._on_error(exc)
                return
