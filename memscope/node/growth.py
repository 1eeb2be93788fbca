"""Growth of a process's memory over a window of samples: the long-run growth rule, in seconds.

The rule is memscope.analysis.unexplained's (:func:`~memscope.analysis.unexplained.steady_rise`):
the level's lower envelope (at each sample, the lowest level of any later one: what the process
never gives back) must rise in every quarter of the window, steadily (the later quarters' rates
within 3x of each other, the first not under a third of theirs), and by at least ``MIN_RATE`` a
second and ``MIN_TOTAL`` in all, over at least ``MIN_SAMPLES`` samples; and not mostly in
``JUMPS`` jumps (:func:`~memscope.analysis.unexplained.mostly_jumps`: a heap growing in a few
steps while it warms up). Here x is time, not steps: a process seen from outside has no steps.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from memscope.analysis.unexplained import MIN_STEPS, lower_envelope, mostly_jumps, steady_rise

# Floors per second. 16 KiB/s is 1.4 GB a day (transformers#1179's leak: 22 GB in 40 h, 150 KiB/s);
# 1 MiB in the window keeps a short window from calling allocator noise growth.
MIN_RATE = 16 << 10
MIN_TOTAL = 1 << 20
MIN_SAMPLES = MIN_STEPS


@dataclass
class Trend:
    """What the window says of one metric."""

    bytes_per_s: float  # rise of the lower envelope over the window (0: nothing kept)
    growing: bool  # the rule's verdict
    first: float | None = None  # the window's first and last sample times (None: no samples)
    last: float | None = None
    samples: int = 0


def trend(points: list[tuple[float, int]], min_rate: float = MIN_RATE, min_total: int = MIN_TOTAL,
          min_samples: int = MIN_SAMPLES) -> Trend:
    """The trend of ``points`` (time, bytes), oldest first."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return Trend(0.0, False, points[0][0] if points else None, points[-1][0] if points else None,
                     len(points))
    env = lower_envelope([p[1] for p in points])
    rate = (env[-1] - env[0]) / (points[-1][0] - points[0][0])
    found = steady_rise(points, min_rate, min_total, min_samples)
    growing = found is not None and not mostly_jumps(
        [b - a for a, b in zip(env, env[1:])], env[-1] - env[0])
    return Trend(rate, growing, points[0][0], points[-1][0], len(points))


@dataclass
class History:
    """One process's recent samples: (time, host RSS, GPU bytes or None), oldest first."""

    keep_s: float
    samples: deque[tuple[float, int, int | None]] = field(default_factory=deque)

    def add(self, t: float, rss: int, gpu: int | None) -> None:
        self.samples.append((t, rss, gpu))
        while self.samples and self.samples[0][0] < t - self.keep_s:
            self.samples.popleft()

    def window(self, seconds: float) -> list[tuple[float, int, int | None]]:
        if not self.samples:
            return []
        end = self.samples[-1][0]
        return [s for s in self.samples if s[0] >= end - seconds]

    def trends(self, seconds: float) -> tuple[Trend, Trend | None]:
        """(host RSS, GPU memory or None where NVML gave no reading) over the last ``seconds``."""
        win = self.window(seconds)
        rss = trend([(t, r) for t, r, _ in win])
        gpu_points = [(t, g) for t, _, g in win if g is not None]
        return rss, (trend(gpu_points) if gpu_points else None)
