"""Small formatting helpers shared by the text views (sizes: memscope.units)."""

from __future__ import annotations

import time


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts)) + f".{int((ts % 1) * 1000):03d}" \
        + time.strftime("%z", time.localtime(ts))


def clock(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
