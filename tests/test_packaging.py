"""torch-memscope as a user installs it (issue 38): the sdist and the wheel built as a release
builds them (tests/packaging_venvs.py), the wheel with its ``tui`` extra installed into a fresh
venv that already has torch, and memscope run from there (attach, report, the dashboard in a real
terminal); what the distributions hold and the metadata a package index shows; and the unrelated
``memscope`` distribution installed over ours, said in one line with its fix."""

from __future__ import annotations

import email.parser
import json
import re
import shlex
import tarfile
import zipfile
from pathlib import Path

import pytest

from memscope.cli.dashboard_deps import TEXTUAL_MIN
from packaging_venvs import (_hook, clean_env, new_venv, pip, run, shared_build, site_packages, venv_with_torch,
                             wheel_names)
from shared_runs import shared_dir
from tmux_pane import terminal

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parent.parent
VERSION = "0.1.0"


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return shared_build(shared_dir(tmp_path_factory))


@pytest.fixture(scope="module")
def installed(dists: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a fresh venv with torch (linked) and ``wheel[tui]`` installed."""
    python, constraints = venv_with_torch(tmp_path_factory.mktemp("packaged") / "venv")
    pip(python, "install", "-q", "-c", str(constraints), f"{dists[1]}[tui]")
    return python


@pytest.fixture(scope="module")
def recorded(installed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``memscope attach --headless`` of the bundled tiny_gpt example, from the installed venv."""
    where = tmp_path_factory.mktemp("recorded")
    db = where / "run.db"
    res = run(installed, "memscope", "attach", "--headless", "--db", str(db), str(ROOT / "examples" / "tiny_gpt.py"),
              "--steps", "4", cwd=where)
    assert res.returncode == 0, res.stderr
    return db


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        return email.parser.Parser().parsestr(z.read(f"torch_memscope-{VERSION}.dist-info/METADATA").decode())


def test_the_wheel_holds_the_code_and_nothing_else(dists: tuple[Path, Path]) -> None:
    names = set(wheel_names(dists[1]))
    source = {str(p.relative_to(ROOT)) for p in (ROOT / "memscope").rglob("*.py")}
    source |= {str(p.relative_to(ROOT / "tui")) for p in (ROOT / "tui" / "memscope_tui").rglob("*.py")}
    assert source <= names, sorted(source - names)  # every module, the bootstrap's among them
    assert {"memscope/py.typed", "memscope_tui/py.typed", "memscope_tui/app.tcss", "memscope_tui/top.tcss",
            "memscope/agent/runtime/bootstrap/sitecustomize.py", "memscope/agent/runtime/bootstrap/attach-boot.py",
            f"torch_memscope-{VERSION}.dist-info/licenses/LICENSE"} <= names
    assert {n.split("/")[0] for n in names} == {"memscope", "memscope_tui", f"torch_memscope-{VERSION}.dist-info"}
    assert not [n for n in names if n.endswith((".pyc", ".db", ".sqlite"))]


def test_the_metadata_a_package_index_shows(dists: tuple[Path, Path]) -> None:
    meta = _metadata(dists[1])
    assert meta["Name"] == "torch-memscope" and meta["Version"] == VERSION
    assert meta["License-Expression"] == "MIT" and meta.get_all("License-File") == ["LICENSE"]
    classifiers = meta.get_all("Classifier")
    assert not [c for c in classifiers if c.startswith("License ::")]  # the SPDX expression says it
    assert {f"Programming Language :: Python :: 3.{minor}" for minor in range(10, 15)} <= set(classifiers)
    assert {"Operating System :: POSIX :: Linux", "Topic :: Software Development :: Debuggers",
            "Typing :: Typed"} <= set(classifiers)
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert set(urls) == {"Homepage", "Documentation", "Issues"}
    site = re.search(r"^site_url: (\S+)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert site is not None and urls["Documentation"] == site.group(1)
    assert meta.get_all("Provides-Extra") == ["tui", "integrations"]  # no published test extra
    requires = meta.get_all("Requires-Dist")
    assert f'textual>={TEXTUAL_MIN}; extra == "tui"' in requires  # the version memscope tui checks for
    dev_tools = ("pytest", "ruff", "mypy", "mkdocs", "nbclient", "ipykernel", "torch")
    assert not [r for r in requires if re.match(r"[\w-]+", r).group() in dev_tools]  # type: ignore[union-attr]
    assert meta.get_payload().startswith("# memscope")  # the README is the long description


def test_every_readme_link_is_absolute_or_an_anchor() -> None:
    """A package index shows the README without the repository around it."""
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)", readme) + re.findall(r"^\[[^\]]+\]:\s*(\S+)", readme, re.M)
    targets += re.findall(r"""(?:href|src)=["']([^"']+)""", readme)
    assert targets
    relative = [t for t in targets if not re.match(r"(https?://|#)", t)]
    assert not relative, relative


def test_the_sdist_holds_the_package_source_and_no_tests(dists: tuple[Path, Path]) -> None:
    with tarfile.open(dists[0]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "pyproject.toml", "memscope/py.typed", "tui/memscope_tui/app.tcss",
            "memscope/agent/runtime/bootstrap/sitecustomize.py"} <= names
    shipped = {n.split("/")[0] for n in names}
    assert not shipped & {"tests", "examples", "docs", "benchmarks", ".ci"}, shipped
    assert "(`make test`)" in (ROOT / "README.md").read_text()  # where the tests are, said on its page


def test_installed_memscope_records_and_reports(installed: Path, recorded: Path) -> None:
    where = recorded.parent
    found = run(installed, "python", "-c",
                "import memscope, memscope_tui; print(memscope.__file__, memscope_tui.__file__)", cwd=where)
    site = site_packages(installed)
    assert found.stdout.split() == [str(site / "memscope" / "__init__.py"), str(site / "memscope_tui" / "__init__.py")]
    assert (site / "torch").is_symlink()  # installing memscope never touched the torch it found
    text = run(installed, "memscope", "report", str(recorded), cwd=where)
    assert text.returncode == 0, text.stderr
    assert "steps     4 completed" in text.stdout
    data = json.loads(run(installed, "memscope", "report", str(recorded), "--json", cwd=where).stdout)
    assert data["run"]["steps"] == 4 and data["run"]["status"] == "finished" and data["hotspots"]


def test_installed_dashboard_in_a_terminal(installed: Path, recorded: Path) -> None:
    memscope = shlex.quote(str(installed.parent / "memscope"))
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in clean_env().items() if k in ("PATH", "HOME", "LANG", "TERM"))
    with terminal() as pane:
        pane.start(f"cd {shlex.quote(str(recorded.parent))} && env -i {env} {memscope} tui run.db; "
                   "echo TUI_EXIT=$?; sleep 600")
        screen = pane.wait_for(lambda s: "1 Overview" in s and "finished" in s, what="the dashboard")
        assert "tiny_gpt.py --steps 4" in screen
        pane.keys("2")
        pane.wait_for(lambda s: "NaiveAttention" in s, what="the layers view")
        pane.keys("q")
        pane.wait_for(lambda s: "TUI_EXIT=0" in s, what="the dashboard to quit")


CLASH_PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "memscope"
version = "0.1.2"
description = "Stand-in for the unrelated memscope distribution on the package index (C/C++ memory analysis)"

[tool.setuptools]
packages = ["memscope"]
"""
CLASH_INIT = '"""memscope: memory analysis for C/C++ programs."""\n\n\ndef analyze(binary):\n    return binary\n'


def test_the_unrelated_memscope_distribution_is_named_with_its_fix(dists: tuple[Path, Path], tmp_path: Path) -> None:
    """Installed after ours it replaces memscope/__init__.py; the fix the line gives (uninstall
    it, reinstall ours) works. The venv holds only the two wheels (--no-deps: the check runs
    before memscope needs anything but the standard library)."""
    src = tmp_path / "clash"
    (src / "memscope").mkdir(parents=True)
    (src / "pyproject.toml").write_text(CLASH_PYPROJECT)
    (src / "memscope" / "__init__.py").write_text(CLASH_INIT)
    other = _hook("build_wheel", src, tmp_path / "wheels")
    ours = dists[1]
    python = new_venv(tmp_path / "venv")
    site = site_packages(python)
    pip(python, "install", "-q", "--no-deps", "--no-index", str(ours))
    assert run(python, "memscope", "--version", cwd=tmp_path).stdout == f"memscope {VERSION}\n"

    pip(python, "install", "-q", "--no-deps", "--no-index", str(other))
    fix = "pip uninstall memscope && pip install --force-reinstall torch-memscope"
    said = (f"memscope: error: the memscope package Python imports ({site / 'memscope' / '__init__.py'}) is not "
            "torch-memscope's: the unrelated memscope 0.1.2 distribution installed its own memscope/__init__.py "
            f"over ours; fix: {fix}\n")
    # docs/getting-started.md shows this line (the path shortened): rerun here, not by the samples' runner
    shown = said.replace(str(site), ".../site-packages").rstrip("\n")
    doc = (ROOT / "docs" / "getting-started.md").read_text()
    assert f"```text\n$ memscope --version\n{shown}\n```" in doc, shown
    for argv in (["memscope", "--version"], ["memscope", "report", "run.db"],
                 ["python", "-m", "memscope", "--version"]):
        res = run(python, *argv, cwd=tmp_path)
        assert (res.returncode, res.stdout, res.stderr) == (2, "", said), argv

    pip(python, "uninstall", "-q", "-y", "memscope")  # the fix's first half takes our __init__.py too
    res = run(python, "memscope", "--version", cwd=tmp_path)
    assert (res.returncode, res.stdout) == (2, "") and "Traceback" not in res.stderr
    assert "its __init__.py is missing" in res.stderr and res.stderr.count("\n") == 1 and fix in res.stderr
    # the second half (from the wheel here: the package index is not this test's)
    pip(python, "install", "-q", "--no-deps", "--no-index", "--force-reinstall", str(ours))
    assert run(python, "memscope", "--version", cwd=tmp_path).stdout == f"memscope {VERSION}\n"
