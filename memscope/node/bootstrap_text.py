"""The text the interpreter of a running process runs as a pending call, and what it does.

It is ONE line (so that turning its first byte into ``#`` makes all of it a comment: see
:func:`memscope.node.debuggers.neutralize`), run by ``PyRun_SimpleString`` in ``__main__``'s
namespace, where it binds no name: it ``exec``s a small program in a dictionary of its own. That
program only starts a thread (``memscope-attach``) and returns; the thread reads memscope's
bootstrap file (``memscope/agent/runtime/bootstrap/attach-boot.py``) and runs it. Nothing in the
pending call can raise into the training: every step is inside ``try``; a failure in the thread
is written into the run file as an ``attach_failed`` event (the command prints it), never onto
the training's stderr.

Past its deadline the program starts nothing: a bootstrap that the interpreter reaches only
after the command gave up does nothing even if the neutralising write did not land.
"""

from __future__ import annotations

import os
from typing import Any

import memscope

_PROGRAM = '''\
import sys, threading, time
A = {args!r}
def run(A=A):
    try:
        with open(A["boot"], "rb") as f:
            src = f.read()
        exec(compile(src, A["boot"], "exec"), {{"__name__": "_memscope_attach", "ARGS": A}})
    except BaseException as exc:
        try:
            import sqlite3
            c = sqlite3.connect(A["db"], timeout=5)
            try:
                with c:
                    c.execute("INSERT INTO events (proc, t, step, kind, message, data) VALUES "
                              "(NULL, ?, NULL, 'attach_failed', ?, NULL)",
                              (time.time(), "%s: %s" % (type(exc).__name__, exc)))
            finally:
                c.close()
        except BaseException:
            pass
try:
    if time.time() < A["deadline"]:
        threading.Thread(target=run, name="memscope-attach", daemon=True).start()
except BaseException:
    pass
'''

BOOT_FILE = os.path.join(os.path.dirname(os.path.abspath(memscope.__file__)), "agent", "runtime",
                         "bootstrap", "attach-boot.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(memscope.__file__)))  # holds memscope/


def pending_call(args: dict[str, Any]) -> bytes:
    """The one line queued in the target. ``args`` (plain data) reach the bootstrap as ``ARGS``;
    the boot file's path, memscope's location and version are added here."""
    full = {"boot": BOOT_FILE, "root": ROOT, "version": memscope.__version__, **args}
    program = _PROGRAM.format(args=full)
    line = f"exec({program!r}, {{'__name__': '_memscope_attach'}})"
    assert "\n" not in line  # repr() escapes the program's newlines: one line, one comment
    return line.encode("utf-8")
