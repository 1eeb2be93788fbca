"""memscope.display: the one place a string from a run file is made safe to show (issue 22)."""

from __future__ import annotations

import io
import sys

import pytest

from memscope.display import NAME_LIMIT, _SafeWriter, guarded_stdout, safe_lines, shown


@pytest.mark.parametrize("raw, expected", [
    ("blocks.0.attn", "blocks.0.attn"),
    ("naïve 中文 emoji 👩‍💻", "naïve 中文 emoji 👩‍💻"),  # printable text and a ZWJ sequence stay
    ("a\x1b[2Jb", "a\\x1b[2Jb"),
    ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),
    ("nul\x00", "nul\\x00"),
    ("del\x7f c1\x9b", "del\\x7f c1\\x9b"),
    ("ok\nFAKE", "ok\\nFAKE"),
    ("tab\tcr\r", "tab\\tcr\\r"),
    ("fix\u202eevil\u202c", "fix\\u202eevil\\u202c"),
    ("\u2066\u2067\u2068\u2069\u200e\u200f\u061c\u202a\u202b\u202d", "\\u2066\\u2067\\u2068\\u2069\\u200e"
     "\\u200f\\u061c\\u202a\\u202b\\u202d"),
    ("line\u2028sep", "line\\u2028sep"),
    ("[@click=quit]x[/]", "[@click=quit]x[/]"),  # markup is the dashboard's business: kept here
    (None, ""),
    (42, "42"),
])
def test_shown_escapes_controls_and_bidi(raw: object, expected: str) -> None:
    assert shown(raw) == expected


def test_every_c0_c1_control_is_escaped() -> None:
    raw = "".join(chr(i) for i in [*range(0x20), *range(0x7F, 0xA0)])
    out = shown(raw, limit=10_000)
    assert all(0x20 <= ord(ch) < 0x7F for ch in out)
    assert out.count("\\") == len(raw)


def test_a_long_name_is_cut_with_its_length() -> None:
    out = shown("H" * (1 << 20))
    assert out == "H" * NAME_LIMIT + f"… ({1 << 20} chars)"
    escaped = shown("\x1b" * 1000)  # escapes count toward the limit too
    assert len(escaped) < NAME_LIMIT + 30 and escaped.endswith("(1000 chars)")


def test_safe_lines_keeps_newlines_and_cuts_lines() -> None:
    assert safe_lines("a\x1bb\nc\u202ed") == "a\\x1bb\nc\\u202ed"
    cut = safe_lines("x" * 50 + "\nshort", line_limit=10)
    assert cut == "x" * 10 + "… (50 chars)\nshort"


def test_guarded_stdout_escapes_across_writes() -> None:
    sink = io.StringIO()
    w = _SafeWriter(sink, line_limit=8)
    w.write("abc\x1b")
    w.write("defghijk")  # the line passes 8 characters inside this write
    w.write("more\nnext\x07\n")
    assert sink.getvalue() == "abc\\x1bdefg… (line cut)\nnext\\x07\n"
    original = sys.stdout
    with guarded_stdout():
        assert sys.stdout is not original
    assert sys.stdout is original


def test_middle_keeps_both_ends() -> None:
    from memscope.display import middle

    name = "base_model.model.transformer.h.0.attn.c_attn.lora_A.default"
    assert middle(name, len(name)) == name and middle("lm_head", 3) == "l…d"
    for width in range(3, len(name)):
        cut = middle(name, width)
        head, tail = cut.split("…")
        assert len(cut) <= width and head and tail and name.startswith(head) and name.endswith(tail), (width, cut)
        assert len(cut) >= width * 2 // 3, (width, cut)  # most of the room is used
    # dotted names keep whole trailing parts while they use most of the room
    assert middle(name, 40) == "base_model.….attn.c_attn.lora_A.default"
    assert middle("x" * 30, 10) == "xxx…xxxxxx"  # no dots: a third before, the rest after
