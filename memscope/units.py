"""Units formatting shared by every layer that shows numbers (floor: imports nothing of memscope)."""

from __future__ import annotations

import re


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} PiB"


def axis_bytes(n: int | float) -> str:
    """A round value on a chart's axis in :func:`human_bytes`' units, without its trailing zeros:
    ``0 B``, ``512 KiB``, ``2.5 MiB``, ``1.25 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.2f}".rstrip("0").rstrip(".") + f" {unit}"
        value /= 1024
    return f"{value:g} PiB"


_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10**3,
    "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
    "g": 1 << 30, "gib": 1 << 30, "gb": 10**9,
    "t": 1 << 40, "tib": 1 << 40, "tb": 10**12,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes of ``24GiB``, ``24GB`` (decimal), ``16G`` (a bare letter is binary, as in
    ``nvidia-smi`` and ``ls -h``), ``8000MiB`` or a plain byte count. ValueError if not a size
    above zero."""
    m = _SIZE.match(text or "")
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 24GiB, 24GB, 16G, 8000MiB)")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"size must be above zero, not {text!r}")
    return value
