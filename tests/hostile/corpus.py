"""The hostile-data corpus (issue 22): strings a run file can carry that must stay inert in
every human-facing output. Imported by the tests and by hostile_train.py (a real script)."""

from __future__ import annotations

BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
HUGE_LEN = 1 << 20


def corpus(trap_dir: str) -> dict[str, str]:
    """{label: string}. ``trap_dir``: where a markup click action would write its screenshot."""
    return {
        "click_screenshot": f"[@click=app.screenshot('precious.txt','{trap_dir}')]blocks.0.attn[/]",
        "click_quit": "[@click=quit]quit",
        "click_bell": "[@click=app.bell]bell[/]",
        "close_tag": "[/]",
        "close_named": "emb[/CLS]",
        "pad": "[pad]",
        "style": "[bold red on white]loud[/bold red on white]",
        "c0": "c0:" + "".join(chr(i) for i in range(0x20)),
        "c1_del": "c1:" + "".join(chr(i) for i in range(0x7F, 0xA0)),
        "osc0_title": "\x1b]0;PWNED TITLE\x07title",
        "osc8_link": "\x1b]8;;https://evil.example/\x1b\\link\x1b]8;;\x1b\\",
        "osc52_clipboard": "\x1b]52;c;ZWNobyBwd25lZA==\x07clip",
        "csi_clear": "\x1b[2J\x1b[H\x1b[31mclear",
        "bidi": "fix" + BIDI + "evil",
        "nul": "nul\x00byte",
        "newline": "ok\nFAKE: memscope: error: nothing",
        "formula": '=HYPERLINK("http://evil.example","x")',
        "formula_plus": "+cmd|' /C calc'!A0",
        "formula_at": "@SUM(1+1)",
        "html": "<script>alert(1)</script><img src=x onerror=alert(1)>\"'",
        "huge": "H" * HUGE_LEN,
    }


def dangerous(text: str) -> list[str]:
    """What in ``text`` could drive a terminal or reorder text: control characters other than
    the newline, and bidi controls. Empty when ``text`` is safe to print."""
    bad = []
    for ch in set(text):
        code = ord(ch)
        if (code < 0x20 and ch != "\n") or 0x7F <= code <= 0x9F or ch in BIDI or ch in "\u2028\u2029":
            bad.append(f"U+{code:04X}")
    return sorted(bad)
