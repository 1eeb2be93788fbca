"""Steps a long run's writer folded into windows (memscope/store/fold.py), for the analyses."""

from __future__ import annotations

import statistics
from typing import Any

from memscope.store.reader import RunReader


def median_step(durations: list[float], windows: list[dict[str, Any]]) -> float | None:
    """The median step time: of the steps themselves, or, once steps were folded, of the kept
    steps and each window's mean standing for its steps (exact when a window's steps are alike)."""
    if not windows:
        return statistics.median(durations) if durations else None
    weighted: list[tuple[float, int]] = sorted([(float(d), 1) for d in durations]
                      + [(float(w["duration_sum"]) / w["steps"], int(w["steps"])) for w in windows if w["steps"]])
    total = sum(n for _, n in weighted)
    if not total:
        return None
    half, seen = total / 2, 0
    for value, n in weighted:
        seen += n
        if seen >= half:
            return value
    return weighted[-1][0]


def median_with_windows(reader: RunReader, proc: int, ok: int) -> float | None:
    """The median step time of a process whose writer folded steps: its kept steps' durations
    (a few thousand at most: folding keeps only the steps near events) and its windows."""
    durations = [float(r["duration_s"]) for r in reader.query(
        "SELECT \"end\" - start AS duration_s FROM steps WHERE proc = ? AND status = 'ok'", (proc,))]
    return median_step(durations, reader.step_windows(proc))
