"""``python -I`` / ``-E`` / ``-S`` under ``memscope attach``: keep the agent reachable.

Those flags make the interpreter ignore ``PYTHONPATH`` (``-I``, ``-E``) or skip ``site``
(``-S``, ``-I`` keeps site but not PYTHONPATH), so the ``sitecustomize`` bootstrap never runs and
the record would be empty. For a script or ``-m module`` the supervisor rewrites the command to
``python FLAGS <bootstrap>/_memscope_isolated_main.py SCRIPT ARGS...``: the flags stay in force
for the user's code; that file arms the agent, restores ``sys.argv`` / ``sys.path[0]`` and runs
the script as ``__main__``. A ``-c`` command cannot be rewritten this way: attach says so.
"""

from __future__ import annotations

import os
import re
from typing import Sequence

PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)*)?$")
_TAKES_VALUE = {"-W", "-X", "--check-hash-based-pycs"}
_ENV_BLIND = set("IES")  # flags that keep the sitecustomize bootstrap from running


def blind_flags(command: Sequence[str]) -> tuple[str, int | None, str | None]:
    """For a Python command: the flags among I, E, S it carries, the index of the script (or
    of ``-m``) after the interpreter's own options, and ``"-c"`` when it runs a command string.
    ("", None, None) for anything else."""
    if not command or not PYTHON_NAME.match(os.path.basename(command[0])):
        return "", None, None
    found = ""
    i = 1
    while i < len(command):
        arg = command[i]
        if arg == "--":
            return found, (i + 1 if i + 1 < len(command) else None), None
        if arg in ("-m", "-c"):
            return found, i, arg if arg == "-c" else None
        if not arg.startswith("-") or arg == "-":
            return found, i, None
        if arg in _TAKES_VALUE:
            i += 2
            continue
        if arg.startswith("--"):
            i += 1
            continue
        letters = arg[1:]
        for ch in letters:
            if ch in _ENV_BLIND and ch not in found:
                found += ch
            if ch in "WX":  # -Wignore: the rest is its value
                break
            if ch in "mc":  # -Im module
                return found, None, "-" + ch
        i += 1
    return found, None, None


def rewrite(command: Sequence[str], bootstrap_dir: str) -> tuple[list[str], str | None]:
    """The command to run so the agent starts despite -I/-E/-S, and a note for the user when
    it cannot (None when nothing was needed or the rewrite covers it)."""
    flags, at, special = blind_flags(command)
    if not flags:
        return list(command), None
    shown = " ".join(f"-{f}" for f in flags)
    if special is not None or at is None:
        return list(command), (f"recording empty: python {shown} ignores PYTHONPATH, so "
                               "memscope's bootstrap cannot start in it, and a -c command cannot "
                               "be rewritten to start it; drop the flag, run a script file, or "
                               "call memscope.start() in the code")
    runner = os.path.join(bootstrap_dir, "_memscope_isolated_main.py")
    return [*command[:at], runner, *command[at:]], None
