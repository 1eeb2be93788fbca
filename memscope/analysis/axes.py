"""Round axis ticks for the charts every UI draws (the dashboard, the HTML page), so that both
scale a plot the same way: memory from zero to a round top in the unit of its largest value,
time and steps at 1, 2, 2.5 or 5 times a power of ten.

    byte_ticks(346_394_624)      # (419430400.0, [0.0, 104857600.0, ..., 419430400.0]): 0-400 MiB
    number_ticks(0.0, 3.4, 6)    # [0.0, 0.5, 1.0, ..., 3.0]
"""

from __future__ import annotations

import math


def nice_step(span: float, ticks: int) -> float:
    """A round tick spacing (1, 2, 2.5, 5 times a power of ten) giving about ``ticks`` ticks."""
    raw = span / max(ticks, 1)
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return float(m * mag)
    return float(10 * mag)


def byte_ticks(v_hi: float, ticks: int = 4) -> tuple[float, list[float]]:
    """A memory axis from 0 (memory is read against zero: a flat line looks flat, a 5% rise
    looks like 5%): its top and tick values, round in the unit of the largest value."""
    if not v_hi > 0 or not math.isfinite(v_hi):
        return 1.0, [0.0]
    unit = 1024.0 ** min(4, int(math.log(max(v_hi, 1.0), 1024)))
    step = nice_step(v_hi / unit, ticks) * unit
    top = step * (math.floor(v_hi / step) + 1)
    return top, [i * step for i in range(int(round(top / step)) + 1)]


def number_ticks(lo: float, hi: float, ticks: int = 8, integer: bool = False) -> list[float]:
    """Round values in [lo, hi], about ``ticks`` of them (whole numbers for steps)."""
    step = nice_step(hi - lo, ticks)
    if integer:
        step = max(1.0, float(round(step)))
    v = math.ceil(lo / step - 1e-9) * step
    out: list[float] = []
    while v <= hi + 1e-9 and len(out) < 100:
        out.append(v)
        v += step
    return out
