"""The documentation site (docs/, built by MkDocs) documents every command, with an example, and
every option; it builds with ``--strict``; the README stays a short front page."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, memscope
from memscope.cli import COMMANDS, build_parser

DOCS = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
ALL = "\n".join(DOCS.values())


def help_commands() -> list[str]:
    """The subcommands ``memscope --help`` lists."""
    out = memscope("--help")
    assert out.returncode == 0, out.stderr
    listing = out.stdout.split("COMMAND\n", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^ {4}(\w+)(?: |$)", listing, re.M)  # a long name has its help on the next line


def test_help_lists_every_command() -> None:
    assert sorted(help_commands()) == sorted(COMMANDS)


def test_every_command_has_a_section_and_an_example_in_the_docs() -> None:
    for name in help_commands():
        assert re.search(rf"^#+ .*`memscope {name}`", DOCS["reference.md"], re.M), \
            f"no section for memscope {name} in docs/reference.md"
        assert re.search(rf"^#+ .*`memscope {name}[ `]", "\n".join(v for k, v in DOCS.items() if k != "reference.md"),
                         re.M), f"no page of docs/ has a heading for memscope {name}"
        assert re.search(rf"^\s*(\$ )?memscope {name} ", ALL, re.M), f"no example of memscope {name} in docs/"


def test_every_option_is_documented() -> None:
    from memscope.cli import _Parser
    from memscope.cli import attach

    parser = _Parser(prog="memscope attach")
    attach.register(parser)
    sub = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    parsers = {"attach": parser, **{n: p for n, p in sub.items() if n != "attach"}}
    for name, p in parsers.items():
        for action in p._actions:
            for flag in action.option_strings:
                if flag in ("-h", "--help") or not flag.startswith("--") or action.help == "==SUPPRESS==":
                    continue
                assert flag in ALL, f"memscope {name} {flag} is not in docs/"


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    assert set(re.findall(r"^\s+- [^:]+: (\S+\.md)$", nav, re.M)) == set(DOCS)


def test_the_readme_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for command in ("make demo", "make test"):
        assert command in readme
    # its links are the published site's (a package index shows the README without docs/ beside
    # it: tests/test_packaging.py checks every link is absolute)
    site = re.search(r"^site_url: (\S+)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert site is not None
    pages = re.findall(re.escape(site.group(1)) + r"([\w-]+)/", readme)
    for page in pages:
        assert (ROOT / "docs" / f"{page}.md").exists(), page
    linked = {f"{page}.md" for page in pages}
    assert linked >= set(DOCS) - {"index.md"}, sorted(set(DOCS) - linked)


def test_the_docs_quote_no_stale_claims() -> None:
    """The contradictions issue #24 found stay fixed (a figure is stated once, as tested)."""
    text = ALL + (ROOT / "README.md").read_text()
    text = " ".join(text.split())
    for stale in ("about 10 minutes", "about 20 minutes", "line for line", "activations within 1%",
                  "at step 7 or earlier", "about 1.5 ms", "reported from step 17"):
        assert stale not in text, stale


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (pip install --group dev: make install)")
    out = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "site" / "leaks" / "index.html").exists()
