"""Is anyone still writing a run that says ``running``? A reader's judgement, never stored.

A run file's ``running`` status is only true while a writer is left to finish it. When the
supervisor and its child were killed together (SIGKILL, a lost node, a full disk that refused the
final write), nothing will ever change it, and readers say ``abandoned`` instead:

- on the host that wrote it, by pid: the run's owner (attach's supervisor, or the script under
  ``memscope.start()``) and the processes still marked running are looked up; a pid that exists
  but started after the run did is someone else's;
- elsewhere (a copied file, another node), or when no pid is known, by the writers' heartbeat:
  each agent stamps its process row about every second; with no stamp, memory sample or start
  newer than :data:`STALE_S`, the run is abandoned.
"""

from __future__ import annotations

import math
import os
import socket
import time
from typing import Any, Callable, Iterable

STALE_S = 60.0  # no heartbeat for this long: no writer left (an inventory scan holds the GIL for seconds)
_START_SLACK_S = 2.0  # a pid whose process started this much after the run is a reused pid


def pid_alive(pid: int, not_after: float | None = None) -> bool | None:
    """Whether ``pid`` names a live process that existed by ``not_after`` (unix seconds).
    None when it cannot be told (no permission to look)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, someone else's
    except OSError:
        return None
    if not_after is None:
        return True
    try:
        import psutil

        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return bool(proc.create_time() <= not_after + _START_SLACK_S)
    except Exception:  # psutil.NoSuchProcess (gone meanwhile), AccessDenied
        return None


def is_abandoned(run: dict[str, Any], processes: Iterable[dict[str, Any]],
                 last_activity: Callable[[], float | None], now: float | None = None,
                 host: str | None = None,
                 alive: Callable[[int, float | None], bool | None] = pid_alive) -> bool:
    """True when ``run`` says running but no writer is left to finish it.

    ``last_activity`` returns the newest sign of life in the file (heartbeats, samples); it is
    called only when pids cannot decide."""
    if run.get("status") != "running":
        return False
    now = time.time() if now is None else now
    host = socket.gethostname() if host is None else host
    started = _number(run.get("started"))
    procs = list(processes)
    if run.get("host") == host:
        pids = [_int(run.get("owner_pid"))]
        pids += [_int(p.get("pid")) for p in procs if p.get("status") == "running"
                 and p.get("host") in (None, host)]
        known = [p for p in pids if p is not None]
        if known:
            verdicts = [alive(pid, started) for pid in known]
            if any(v is True for v in verdicts):
                return False
            if all(v is False for v in verdicts):
                return True
    newest = max((x for x in (_number(last_activity()), started) if x is not None), default=None)
    if newest is None:
        return False  # nothing to judge by: leave it as the file says
    return now - newest > STALE_S


def _number(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
