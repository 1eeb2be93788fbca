"""memscope: a memory debugger for PyTorch training.

The reading side (store, analysis, report, cli) never imports torch; the functions below load
the agent, and with it torch, only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from memscope.agent.runtime.agent import Agent

__all__ = ["__version__", "start", "stop", "step", "profile"]


def start(db: str | None = None, **options: Any) -> "Agent":
    """Start recording this process into run file ``db`` (returns the running agent).

    Under ``memscope attach`` the agent is already running and is returned as it is.
    Options: ``sample_hz`` (20), ``nvml_interval`` (1.0 s), ``force`` (overwrite ``db``),
    ``group_readable`` (the run file 0640 instead of 0600).
    """
    from memscope.agent.runtime.api import start as _start

    return _start(db, **options)


def stop() -> None:
    """Stop recording: flush the run file and remove every hook. Safe to call twice."""
    from memscope.agent.runtime.api import stop as _stop

    _stop()


def step() -> None:
    """Mark the end of a training step. Once called, automatic step detection is off."""
    from memscope.agent.runtime.api import step as _step

    _step()


def profile(db: str | None = None, **options: Any) -> "AbstractContextManager[Agent]":
    """``with memscope.profile("run.db"):`` records the block, then stops."""
    from memscope.agent.runtime.api import profile as _profile

    return _profile(db, **options)
