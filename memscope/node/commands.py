"""Command lines of other processes as memscope stores and exports them: secrets taken out.

PLACEHOLDER until memscope/redact.py (the project's one argv redaction, another branch) lands:
then :func:`shown_argv` calls it and the local rule below goes. Meanwhile the same promise, in
short: values of options whose name says key, token, secret or password, and the userinfo of a
URL, are replaced by ``***``; nothing else is changed.
"""

from __future__ import annotations

import re

_SECRET_OPTION = re.compile(r"^--?[\w.-]*(key|token|secret|passw(or)?d|credential)[\w.-]*$", re.I)
_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.-]*://)[^/@\s]+@", re.I)
MASK = "***"


def shown_argv(argv: list[str]) -> list[str]:
    """``argv`` with its secrets replaced (see the module's docstring)."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        name, eq, _value = word.partition("=")
        if _SECRET_OPTION.match(name):
            if eq:
                out.append(f"{name}={MASK}")
            else:
                out.append(word)
                hide_next = True
            continue
        out.append(_USERINFO.sub(lambda m: m.group(1) + MASK + "@", word))
    return out
