"""``os.exec*`` and ``os._exit`` in a recorded process: the record is flushed and ended first.

An exec replaces the process's program on the spot, ``os._exit`` (how a forked child ends) ends
it without the exit handlers that stop the agent: the writer's last rows (up to a quarter second
of them) and the process row's end would be lost with it. The agent wraps ``os.execv`` and
``os.execve`` (``execl``, ``execlp``, ``execvp``, ``execvpe`` and the rest call them) and
``os._exit``, calls its ``before`` (for an exec an event; then the agent's stop: hooks removed,
rows flushed, the process row ended) and then the original, with the same arguments: what the
call does, returns or raises is unchanged. Removed at the agent's stop (only where the wrapper
is still what ``os`` holds).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

_PRIMITIVES = ("execv", "execve", "_exit")


class ExecHook:
    def __init__(self, before: Callable[[str, tuple[Any, ...]], None]) -> None:
        self._before = before
        self._installed: dict[str, tuple[Any, Any]] = {}  # name -> (original, wrapper)

    def install(self) -> None:
        for name in _PRIMITIVES:
            original = getattr(os, name, None)
            if original is None or name in self._installed:
                continue
            wrapper = self._wrap(name, original)
            setattr(os, name, wrapper)
            self._installed[name] = (original, wrapper)

    def remove(self) -> None:
        for name, (original, wrapper) in self._installed.items():
            if getattr(os, name, None) is wrapper:
                setattr(os, name, original)
        self._installed = {}

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        before = self._before

        @functools.wraps(original)
        def exec_flushed(*args: Any, **kwargs: Any) -> Any:
            try:
                before(name, args)
            except Exception:  # noqa: BLE001 - the record's loss, never the program's
                pass
            return original(*args, **kwargs)

        return exec_flushed
