"""A ^C that lands in one of memscope's callbacks reaches the program all the same.

Python runs a signal's handler in the main thread between two bytecodes, wherever that thread
is. When it is inside a callback Python calls on its own (the live-tensor registry's
``gc.callbacks`` hook runs at every collection; weakref callbacks), the handler's
KeyboardInterrupt is raised there, and Python reports it as "Exception ignored" and goes on: the
training ignored ^C (seen: 1 in 10 SIGINTs at random moments of an attached loop). Python hands
such an exception to ``sys.unraisablehook``: this module's hook has the interrupt delivered again, from
memscope's thread (``_thread.interrupt_main``: the main thread's next bytecode runs the program's
own SIGINT handler, as for a real ^C; called in the main thread, the hook itself would take it)
when the exception was raised in memscope's code, and passes everything else to the hook it
replaced.
"""

from __future__ import annotations

import _thread
import os
import sys
from typing import Any, Callable, Optional

_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # memscope/
_previous: Any = None
_later: Optional[Callable[[Callable[[], None]], bool]] = None  # runs a call on memscope's thread


def _ours(unraisable: Any) -> bool:
    tb = unraisable.exc_traceback
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE + os.sep):
            return True
        tb = tb.tb_next
    owner = getattr(unraisable.object, "__self__", unraisable.object)
    return str(getattr(type(owner), "__module__", "")).startswith("memscope.") or \
        str(getattr(unraisable.object, "__module__", "") or "").startswith("memscope.")


def _hook(unraisable: Any) -> None:
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        try:
            mine = _ours(unraisable)
        except Exception:
            mine = False
        if mine and _later is not None and _later(_thread.interrupt_main):
            return
    (_previous or sys.__unraisablehook__)(unraisable)


def install(later: Callable[[Callable[[], None]], bool]) -> None:
    """Wrap the process's unraisable hook (once; it stays after the agent stops: weakref
    callbacks of memscope's can still run then, and it passes every other exception on)."""
    global _previous, _later
    _later = later
    if sys.unraisablehook is not _hook:
        _previous = sys.unraisablehook
        sys.unraisablehook = _hook



def uninstall() -> None:
    """Put the process's unraisable hook back (a detach: the process goes on without memscope),
    unless something wrapped ours since (then ours stays, passing everything on)."""
    global _previous, _later
    _later = None
    if sys.unraisablehook is _hook:
        sys.unraisablehook = _previous or sys.__unraisablehook__
        _previous = None
