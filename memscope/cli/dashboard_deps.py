"""Whether the dashboard can start here, and if not, the one command that makes it start.

The dashboard (``memscope_tui``) ships in torch-memscope's wheel; textual, which it draws with, is
the ``tui`` extra's. Checked before the dashboard starts, cheaply (it is on the way to the first
paint: no importlib.metadata, whose import alone is 20 ms): the installed textual's version is the
name of its dist-info directory."""

from __future__ import annotations

import importlib.util
import os
import re

INSTALL = 'pip install "torch-memscope[tui]"'
# the tui extra's lower bound in pyproject.toml (tests/test_packaging.py keeps the two equal;
# tests/test_lowest_bounds.py runs the dashboard's tests with it)
TEXTUAL_MIN = "8.2.7"


def missing() -> str | None:
    """None when the dashboard can start; else one line: what is missing and the command."""
    textual = importlib.util.find_spec("textual")
    if textual is None or importlib.util.find_spec("memscope_tui") is None:
        return f"the dashboard is not installed (it needs textual): {INSTALL}"
    have = _installed_version(textual.origin)
    if have is not None and _numbers(have) < _numbers(TEXTUAL_MIN):
        return f"the dashboard needs textual>={TEXTUAL_MIN}, and textual {have} is installed: {INSTALL}"
    return None


def _installed_version(origin: str | None) -> str | None:
    """The version in ``textual-X.dist-info`` beside the package (None where there is none)."""
    if not origin:
        return None
    where = os.path.dirname(os.path.dirname(origin))
    try:
        names = os.listdir(where)
    except OSError:
        return None
    for name in names:
        found = re.fullmatch(r"textual-([^-]+)\.dist-info", name)
        if found:
            return found.group(1)
    return None


def _numbers(version: str) -> tuple[int, ...]:
    """``8.2.8`` -> (8, 2, 8); a pre-release's suffix ends the numbers (``1.0.0a1`` -> (1, 0, 0))."""
    out = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        out.append(int(digits.group()))
        if digits.end() != len(part):
            break
    return tuple(out)
