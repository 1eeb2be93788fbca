"""^C ends a dashboard with exit status 130, as it ends every memscope command.

In the dashboard the terminal is in raw mode: ^C is a key (the apps bind it), and no SIGINT is
sent. A SIGINT that does arrive (``kill -INT``, a process group's ^C) ends the app the same way,
its terminal restored, instead of a KeyboardInterrupt inside Textual's loop (which exited 1).
"""

from __future__ import annotations

import asyncio
import signal

from textual.app import App

INTERRUPTED = 130  # 128 + SIGINT: what a shell shows for a command ^C ended


def exit_on_sigint(app: App[int]) -> None:
    """From the app's ``on_mount`` (its loop, the main thread): SIGINT ends ``app`` with 130.
    Not when SIGINT is ignored: ``memscope attach`` starts its foreground dashboard so, and a ^C
    to the process group is then the training's, not the dashboard's."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, app.exit, None, INTERRUPTED)
    except (NotImplementedError, RuntimeError, ValueError):  # no Unix signals, or not the main thread
        pass
