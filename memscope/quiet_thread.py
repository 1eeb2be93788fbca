"""memscope's own threads, out of sight of the user's tracers (floor: imports nothing of memscope).

``threading.settrace(f)`` / ``threading.setprofile(f)`` install ``f`` in every thread started
after the call: a training script's tracer would also trace memscope's thread (its
output would differ under ``memscope attach``). A :class:`QuietThread` starts with neither hook:
``threading`` reads them when the new thread boots, so they are held at None from ``start()``
until the new thread is running, then put back (unless the program changed them meanwhile).

Its stack is small (:data:`STACK_BYTES`, not the 8 MiB of RLIMIT_STACK): under ``ulimit -v`` every
MiB memscope reserves is one the training cannot have. ``threading.stack_size`` is process-wide,
so it is set only for the moment of our ``start()`` and put back at once: threads the program
starts keep its own setting.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

_swap = threading.Lock()  # two quiet starts at once must not restore each other's None
_BOOT_WAIT_S = 5.0
# our threads run shallow Python (a loop, psutil, sqlite3, torch's and NVML's memory queries):
# 2 MiB leaves a wide margin (GPU drivers included, untested here) and spares 6 MiB per thread
STACK_BYTES = 2 << 20


class QuietThread(threading.Thread):
    """A ``threading.Thread`` that never runs the program's ``threading.settrace`` /
    ``threading.setprofile`` hooks (a daemon unless said otherwise)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("daemon", True)
        super().__init__(*args, **kwargs)
        self._booted = threading.Event()

    def start(self) -> None:
        with _swap:
            hooks = {name: getattr(threading, name, None) for name in ("_trace_hook", "_profile_hook")}
            for name in hooks:
                if hasattr(threading, name):
                    setattr(threading, name, None)
            try:
                try:
                    previous = threading.stack_size(STACK_BYTES)
                except (ValueError, RuntimeError):  # a platform that will not size stacks
                    previous = None
                try:
                    super().start()  # returns once the new thread exists, its stack given
                finally:
                    if previous is not None:
                        threading.stack_size(previous)
                self._booted.wait(_BOOT_WAIT_S)  # it has read the hooks (as None) once it runs
            finally:
                for name, value in hooks.items():
                    if hasattr(threading, name) and getattr(threading, name) is None:
                        setattr(threading, name, value)  # unless the program set one meanwhile

    def run(self) -> None:
        self._booted.set()
        # belt and braces: a Python without these private hooks installs the tracer here
        if sys.gettrace() is not None:
            sys.settrace(None)
        if sys.getprofile() is not None:
            sys.setprofile(None)
        super().run()
