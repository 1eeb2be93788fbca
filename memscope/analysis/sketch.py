"""A memory series downsampled to a fixed number of time buckets, updated as rows arrive.

:func:`memscope.analysis.timeline.memory_timeline` slices [first sample, last sample] into equal
buckets, so a live run that grows by one sample moves every bucket edge and needs every row again.
A :class:`MaxSketch` keeps buckets of a fixed width from a fixed origin instead: a new row only
raises its own bucket's maximum; when a row falls past the last bucket, the width doubles and
neighbouring buckets merge (the maximum of two maxima). Its memory and the work per row stay
bounded whatever the run's length, and the global maximum is always exact.

    sk = MaxSketch(size=512, origin=t_first, width=1.0)
    sk.add("rss", t, value)        # one key per series (or per device, summed by points())
    sk.points("rss")               # [(t of the bucket's max, max), ...] in time order
"""

from __future__ import annotations

from collections.abc import Sequence


class MaxSketch:
    """Per key, each bucket's maximum and when it was reached; all keys share the buckets."""

    def __init__(self, size: int, origin: float, width: float) -> None:
        if size < 2:
            raise ValueError("a sketch needs at least 2 buckets")
        self.size = size
        self.origin = origin
        self.width = width if width > 0 else 1e-3
        self.rows = 0  # rows added (for a chunk: the rows it stands for)
        self._buckets: dict[str, dict[int, tuple[float, int]]] = {}

    def add(self, key: str, t: float, value: int, rows: int = 1) -> None:
        """One row (or the maximum of ``rows`` consecutive rows, dated ``t``)."""
        i = int((t - self.origin) / self.width) if t > self.origin else 0
        while i >= self.size:
            self._double()
            i = int((t - self.origin) / self.width)
        buckets = self._buckets.setdefault(key, {})
        current = buckets.get(i)
        if current is None or value > current[1] or (value == current[1] and t < current[0]):
            buckets[i] = (t, value)
        self.rows += rows

    def _double(self) -> None:
        self.width *= 2
        for key, buckets in self._buckets.items():
            merged: dict[int, tuple[float, int]] = {}
            for i in sorted(buckets):
                t, v = buckets[i]
                j = i // 2
                have = merged.get(j)
                if have is None or v > have[1]:  # the earlier bucket wins a tie (seen first)
                    merged[j] = (t, v)
            self._buckets[key] = merged

    def keys(self) -> list[str]:
        return list(self._buckets)

    def points(self, key: str) -> list[tuple[float, int]]:
        """(t, max) per non-empty bucket of ``key``, in time order."""
        buckets = self._buckets.get(key, {})
        return [buckets[i] for i in sorted(buckets)]

    def summed(self, keys: Sequence[str]) -> list[tuple[float, int]]:
        """Per bucket, the sum of ``keys``' maxima, dated at the latest of their dates (a
        series summed over devices, as the timeline sums them)."""
        out: dict[int, tuple[float, int]] = {}
        for key in keys:
            for i, (t, v) in self._buckets.get(key, {}).items():
                t_prev, v_prev = out.get(i, (t, 0))
                out[i] = (max(t, t_prev), v_prev + v)
        return [out[i] for i in sorted(out)]

    def max(self, key: str) -> tuple[float, int] | None:
        """The key's highest value and when (exact: a merge keeps the larger of two maxima)."""
        best: tuple[float, int] | None = None
        for t, v in self._buckets.get(key, {}).values():
            if best is None or v > best[1] or (v == best[1] and t < best[0]):
                best = (t, v)
        return best
