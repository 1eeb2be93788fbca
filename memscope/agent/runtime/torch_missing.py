"""A process under ``memscope attach`` whose ``import torch`` failed says so in the run file.

The agent starts when the process imports torch (autostart's watcher): where torch is not
installed there is nothing to start, and the run ends with no process recorded. The watcher then
writes a ``torch_missing`` event (the interpreter, its Python version, the pid), which attach's end
of the run reads to say in one line why the recording is empty and which interpreter lacks torch
(memscope/runners/empty.py). It is not a ``recording`` line by itself: a process that only probed
for torch (``importlib.util.find_spec``) while others trained is no gap in the record. Imports
neither torch nor anything that does."""

from __future__ import annotations

import os
import sys

from memscope.agent.runtime.config import ENV_DB, EVENT_TORCH_MISSING


def note_torch_missing() -> None:
    """Best effort, once per process (the watcher is one-shot); never raises into the script."""
    db = os.environ.get(ENV_DB)
    if not db:
        return
    try:
        from memscope.store.runs import add_event

        add_event(db, EVENT_TORCH_MISSING, f"pid {os.getpid()}: torch is not installed in {sys.executable}",
                  {"pid": os.getpid(), "executable": sys.executable,
                   "python": "%d.%d" % sys.version_info[:2]})
    except Exception:  # noqa: BLE001 - a note for the end of the run, never the script's failure
        return
