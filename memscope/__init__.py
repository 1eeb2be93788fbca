"""memscope: a memory debugger for PyTorch training.

Recording: ``start``/``stop``/``step``/``profile`` load the agent, and with it torch, only when
called. Reading: ``load(path)`` returns a :class:`memscope.reading.Run` (the report contract as
data, leaks, layers, the timeline model; drawn inline in a notebook) and never imports torch.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
# the mark the command checks: another project's distribution also installs a package named
# memscope, over this file (memscope/name_clash.py)
__distribution__ = "torch-memscope"

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from memscope.agent.runtime.agent import Agent
    from memscope.reading import Run

__all__ = ["__version__", "start", "stop", "step", "profile", "load"]


def start(db: str | None = None, name: str | None = None, **options: Any) -> "Agent":
    """Start recording this process into run file ``db`` (returns the running agent).

    Under ``memscope attach`` the agent is already running and is returned as it is; while this
    process records already, the running agent is returned and a line says which file records.
    ``db`` defaults to ``memscope-SCRIPT-STAMP.db`` (in a notebook: the notebook's name); a path
    this process recorded into before gets the next number (``nb-2.db``). ``name``: the run's
    name (reports show it). Options: ``sample_hz`` (20), ``nvml_interval`` (1.0 s), ``force``
    (overwrite ``db``), ``group_readable`` (the run file 0640 instead of 0600).
    Without torch in this interpreter: :class:`memscope.errors.TorchMissing` (an ImportError).
    """
    _need_torch("memscope.start()")
    from memscope.agent.runtime.api import start as _start

    return _start(db, name=name, **options)


def stop() -> None:
    """Stop recording: flush the run file and remove every hook. Safe to call twice."""
    if _API not in sys.modules:  # nothing was started in this process (and torch stays unloaded)
        return
    from memscope.agent.runtime.api import stop as _stop

    _stop()


def step() -> None:
    """Mark the end of a training step. Once called, automatic step detection is off."""
    if _API not in sys.modules:  # not recording in this process
        return
    from memscope.agent.runtime.api import step as _step

    _step()


def profile(db: str | None = None, name: str | None = None, **options: Any) -> "AbstractContextManager[Agent]":
    """``with memscope.profile("run.db", name="baseline"):`` records the block, then stops
    (the arguments are :func:`start`'s)."""
    _need_torch("memscope.profile()")
    from memscope.agent.runtime.api import profile as _profile

    return _profile(db, name=name, **options)


def load(path: "str | os.PathLike[str] | None" = None) -> "Run":
    """The run file at ``path`` to read (finished or still being written): ``.report()``,
    ``.leaks()``, ``.layers()``, ``.timeline()``; a notebook draws it. Without ``path``: the run
    this process recorded last. Never imports torch."""
    from memscope.reading import load as _load

    return _load(path)


_API = "memscope.agent.runtime.api"


def _need_torch(what: str) -> None:
    """Recording needs torch in this interpreter: say so in one line rather than with the
    agent's ModuleNotFoundError from deep inside it."""
    import importlib.util

    if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
        return
    from memscope.errors import TorchMissing

    raise TorchMissing(f"{what} records PyTorch training, and torch is not installed in {sys.executable}: "
                       f"install it there ({sys.executable} -m pip install torch); reading run files "
                       "(memscope.load, memscope report) works without it")
