"""Small formatting helpers shared by the text views (sizes: memscope.units)."""

from __future__ import annotations

import shlex
import time

from memscope.analysis.summary import Peak


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts)) + f".{int((ts % 1) * 1000):03d}" \
        + time.strftime("%z", time.localtime(ts))


def clock(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def breakdown_source(peak: Peak) -> str:
    """Which moment the peak's breakdown is from: a profiled step is not always the peak's."""
    step, peak_step = peak.breakdown_step, peak.step
    if peak.breakdown_at_failure:
        return f" (at the OOM in step {step}; other: the peak minus these)"
    if step is None:
        return " (step not recorded)"
    if step == peak_step:
        return f" (measured at step {step}, the peak's step)"
    if peak_step is None:
        return f" (measured at profiled step {step})"
    return f" (measured at profiled step {step}, not at the peak's step {peak_step})"


def command_hint(command: str, path: str) -> str:
    """``memscope COMMAND PATH`` for the run file at hand, quoted as a shell reads it (a hint a
    user can paste, instead of a placeholder)."""
    return f"memscope {command} {shlex.quote(path)}"
