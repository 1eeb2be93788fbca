"""A ^C that lands in one of memscope's callbacks (Python reports it as unraisable and goes on)
is delivered again to the program (memscope.agent.runtime.interrupts); anything else goes to the
hook that was there."""

from __future__ import annotations

import _thread
import sys
from types import SimpleNamespace
from typing import Any

from memscope.agent.collectors.inventory.live import LiveTensors
from memscope.agent.runtime import interrupts


def _unraisable(exc: BaseException, obj: Any) -> Any:
    return SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=None, err_msg=None, object=obj)


def test_a_keyboard_interrupt_in_memscopes_callback_is_delivered_again() -> None:
    later: list[Any] = []
    passed_on: list[Any] = []
    saved = sys.unraisablehook
    sys.unraisablehook = passed_on.append
    try:
        interrupts.install(lambda call: later.append(call) or True)
        live = LiveTensors.__new__(LiveTensors)
        sys.unraisablehook(_unraisable(KeyboardInterrupt(), live._on_gc))  # the gc hook, as seen
        assert later == [_thread.interrupt_main] and passed_on == []
        user = _unraisable(KeyboardInterrupt(), lambda *a: None)  # the program's own callback
        other = _unraisable(ValueError("x"), live._on_gc)  # not an interrupt
        sys.unraisablehook(user)
        sys.unraisablehook(other)
        assert passed_on == [user, other] and len(later) == 1
    finally:
        sys.unraisablehook = saved
