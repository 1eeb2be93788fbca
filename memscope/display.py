"""How a string from a run file is shown to a person (floor: imports nothing of memscope).

Module names, class names, holder paths, commands and messages in a run file come from the
user's program and data, and a run file can be handed to someone else. Every human-facing output
(text reports, errors, the dashboard, the HTML report) shows them through :func:`shown`:

* control characters (C0, DEL, C1: ESC, BEL, NUL...) become visible escapes (``\\x1b``), a
  newline ``\\n``, a tab ``\\t``, so a name can neither drive the terminal nor forge a line;
* bidi controls (U+202A-202E, U+2066-2069, U+200E/200F, U+061C) and the Unicode line and
  paragraph separators become ``\\u202e`` and the like, so text cannot be visually reordered;
* a very long string is cut, with an ellipsis and its length.

It adds no markup escaping: the dashboard draws these strings as plain text and the HTML report
escapes them after this. ``--json``, CSV and the run file keep the exact strings.
"""

from __future__ import annotations

import io
import sys
from contextlib import contextmanager
from typing import Iterator, TextIO

NAME_LIMIT = 200      # a module name, a type, a holder path: a few hundred characters at most
TEXT_LIMIT = 2000     # a message, a command line, an evidence sentence
LINE_LIMIT = 20000    # the last guard on one line of text output (tables of long names)

BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
                 "\u2028\u2029")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape_char(ch: str) -> str | None:
    """The visible escape for ``ch``, or None when it is shown as it is."""
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code < 0x20 or 0x7F <= code <= 0x9F:
        return f"\\x{code:02x}"
    if ch in BIDI:
        return f"\\u{code:04x}"
    return None


def _escape(text: str, keep_newlines: bool = False) -> str:
    if text.isprintable():  # the common case: nothing to escape (isprintable is False for Cc/Cf/Zl/Zp)
        return text
    out = []
    for ch in text:
        if keep_newlines and ch == "\n":
            out.append(ch)
            continue
        esc = _escape_char(ch)
        out.append(ch if esc is None else esc)
    return "".join(out)


def shown(value: object, limit: int = NAME_LIMIT) -> str:
    """``value`` as text safe to show to a person: controls and bidi overrides escaped, newlines
    as ``\\n``, and at most about ``limit`` characters (then ``… (N chars)``). None is ``""``."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    head = _escape(text[:limit])
    if len(head) <= limit and len(text) <= limit:
        return head
    return f"{head[:limit]}… ({len(text)} chars)"


def shown_text(value: object) -> str:
    """:func:`shown` for a longer string: a message, a command line, a sentence of advice."""
    return shown(value, TEXT_LIMIT)


def safe_lines(text: str, line_limit: int = LINE_LIMIT) -> str:
    """A block of output text as it may reach a terminal: every control character but the
    newline escaped, bidi controls escaped, each line cut at ``line_limit`` characters. The last
    guard behind :func:`shown` for any field a renderer missed."""
    out = []
    for line in text.split("\n"):
        if len(line) > line_limit:
            line = f"{_escape(line[:line_limit])}… ({len(line)} chars)"
        else:
            line = _escape(line)
        out.append(line)
    return "\n".join(out)


class _SafeWriter(io.TextIOBase):
    """A text stream that passes everything through :func:`safe_lines` (line by line, so a line
    cut across several writes is still cut once)."""

    def __init__(self, target: TextIO, line_limit: int = LINE_LIMIT) -> None:
        super().__init__()
        self._target = target
        self._limit = line_limit
        self._column = 0        # characters written on the current line so far
        self._cut = False       # the current line was already cut

    def write(self, s: str) -> int:
        parts = s.split("\n")
        out = []
        for i, part in enumerate(parts):
            if i:
                out.append("\n")
                self._column, self._cut = 0, False
            if self._cut or not part:
                continue
            room = self._limit - self._column
            if len(part) > room:
                out.append(_escape(part[:room]) + "… (line cut)")
                self._cut = True
            else:
                out.append(_escape(part))
            self._column += len(part)
        self._target.write("".join(out))
        return len(s)

    def flush(self) -> None:
        self._target.flush()

    def isatty(self) -> bool:
        return self._target.isatty()

    def fileno(self) -> int:
        return self._target.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._target, "encoding", "utf-8")


@contextmanager
def guarded_stdout() -> Iterator[None]:
    """While inside, everything printed to ``sys.stdout`` goes through :func:`safe_lines`: the
    text commands' last guard (``--json`` output is plain ASCII and passes unchanged)."""
    original = sys.stdout
    writer = _SafeWriter(original)
    sys.stdout = writer
    try:
        yield
    finally:
        if sys.stdout is writer:
            sys.stdout = original


def middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells, shortened from the middle so both ends stay (a dotted
    module name keeps its first part and as many whole trailing parts as fit:
    ``base_model.….c_attn.lora_A.default``). Shorten a string after :func:`shown`, never before."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:max(width, 0)]
    parts = text.split(".")
    if len(parts) > 2:
        head, tail = parts[0] + ".…", ""
        for part in reversed(parts[1:]):
            grown = "." + part + tail
            if len(head) + len(grown) > width:
                break
            tail = grown
        if tail and len(head) + len(tail) >= width * 2 // 3:  # enough of it kept whole
            return head + tail
    keep = width - 1                    # cells left beside the ellipsis; the tail names the leaf
    front = max(keep // 3, 1) if keep >= 2 else 0
    return text[:front] + "…" + text[len(text) - (keep - front):]
