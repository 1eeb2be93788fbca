"""Command lines of other processes as memscope stores and exports them: secrets taken out by
the project's one rule (:mod:`memscope.redact`), as every run file stores its commands."""

from __future__ import annotations

from memscope.redact import redact_argv


def shown_argv(argv: list[str]) -> list[str]:
    """``argv`` with its secrets replaced (memscope.redact's rule)."""
    return redact_argv(argv)
