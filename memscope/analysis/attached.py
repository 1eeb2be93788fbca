"""A run recorded by attaching to a process that was already running (``memscope attach --pid``).

The process row carries when the process started and when memscope attached; the events say
when and why it detached, or that the process ended while attached. Steps count from the attach:
the training's own step number before it is unknown, and nothing here guesses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memscope.store.reader import RunReader


@dataclass(frozen=True)
class Attached:
    pid: int
    process_started: float | None
    attached: float
    detached: float | None  # None: still attached, or the process ended while attached
    how_it_ended: str | None  # the detach's reason, or that the process ended


def attached_of(reader: RunReader, main: dict[str, Any] | None) -> Attached | None:
    """The attach of the run's main process, or None for a run memscope launched."""
    if main is None or main.get("attached") is None:
        return None
    detached = None
    how = None
    for e in reader.events():
        if e.get("proc") not in (None, main["id"]):
            continue
        if e["kind"] == "detached":
            detached = e["t"]
            data = e["data"] if isinstance(e["data"], dict) else {}
            how = str(data.get("reason") or e["message"] or "")
        elif e["kind"] == "process_ended" and how is None:
            how = "the process ended while memscope was attached"
    started = main.get("process_started")
    return Attached(pid=int(main["pid"]), process_started=float(started) if started is not None else None,
                    attached=float(main["attached"]), detached=detached, how_it_ended=how)
