"""The README documents every command, with an example, and every attach option."""

from __future__ import annotations

import re
from pathlib import Path

from memscope.cli import COMMANDS, build_parser

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_every_command_has_a_section_and_an_example() -> None:
    for name in COMMANDS:
        assert re.search(rf"^###? `memscope {name}[ `]", README, re.M), f"no README section for {name}"
        assert re.search(rf"^\s*(\$ )?memscope {name} ", README, re.M), f"no example of memscope {name}"


def test_every_option_is_documented() -> None:
    from memscope.cli import attach
    from memscope.cli import _Parser

    parser = _Parser(prog="memscope attach")
    attach.register(parser)
    sub = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    parsers = {"attach": parser, **{n: p for n, p in sub.items() if n != "attach"}}
    for name, p in parsers.items():
        for action in p._actions:
            for flag in action.option_strings:
                if flag in ("-h", "--help") or not flag.startswith("--") or action.help == "==SUPPRESS==":
                    continue
                assert flag in README, f"memscope {name} {flag} is not in the README"
