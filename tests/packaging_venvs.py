"""Build torch-memscope's sdist and wheel as a release would, and make fresh virtual environments
to install them in (tests/test_packaging.py, tests/test_lowest_bounds.py, tests/test_without_torch.py).

The distributions are built once per test session for every xdist worker (under a lock in the
session's shared directory: tests/shared_runs.py), from a copy of the files git sees (tracked,
and new ones not ignored), so nothing is written into the checkout: the sdist first, then the
wheel from the unpacked sdist (what pip does with an sdist, and what ``python -m build`` does),
so a file the sdist forgets fails the wheel too. The build runs setuptools' PEP 517 hooks in
this Python (the dev group's setuptools>=77); ``make dist`` runs the same (``python
tests/packaging_venvs.py dist``).

A venv "with torch" gets the torch of the Python running the tests without installing it:
``python -m venv --without-pip``, then symbolic links in its site-packages to the files of torch
and of every distribution torch requires (its dist-info among them, so pip sees them installed),
and a constraints file that pins each at its version so that pip never replaces one (it would
uninstall through the link, from the tests' own venv). pip is this Python's, run with
``--python VENV/bin/python``; what else a venv needs comes from the package index as a user's
install would.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import venv
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path
from typing import Iterable, Sequence

ROOT = Path(__file__).resolve().parent.parent
NAME = "torch_memscope"


def pip(python: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """This Python's pip, installing into (or asking about) the venv of ``python``; a failure
    raises with pip's own words."""
    out = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), *args], capture_output=True,
                         text=True, timeout=timeout, env=clean_env())
    if out.returncode != 0:
        raise AssertionError(f"pip {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a process of a fresh venv: nothing that points at the checkout (the
    tests' PYTHONPATH would put the source before what the venv installed) or at the tests' venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("MEMSCOPE_")}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


# --- building -------------------------------------------------------------------------------

def source_files(root: Path = ROOT) -> list[str]:
    """The files a fresh clone has: tracked, plus new ones git does not ignore."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, text=True, check=True)
    return [f for f in out.stdout.split("\0") if f and (root / f).is_file()]


_HOOK = ("import json, sys\nimport setuptools.build_meta as backend\n"
         "print(json.dumps(getattr(backend, sys.argv[1])(sys.argv[2])))")


def _hook(name: str, where: Path, out_dir: Path) -> Path:
    """Run a PEP 517 hook of setuptools in ``where`` (its working directory), as a frontend does."""
    res = subprocess.run([sys.executable, "-c", _HOOK, name, str(out_dir)], cwd=where, capture_output=True,
                         text=True, timeout=300, env=clean_env())
    if res.returncode != 0:
        raise AssertionError(f"{name} failed in {where}:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}")
    return out_dir / res.stdout.strip().splitlines()[-1].strip('"')


def build(out_dir: Path, root: Path = ROOT) -> tuple[Path, Path]:
    """(sdist, wheel) of the checkout at ``root`` in ``out_dir``: the sdist from a copy of its
    files, the wheel from the unpacked sdist."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="memscope-build-") as tmp:
        copy = Path(tmp) / "src"
        for rel in source_files(root):
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, copy / rel)
        sdist = _hook("build_sdist", copy, out_dir)
        with tarfile.open(sdist) as tar:
            # the "data" filter (no links out, no device files) where this Python has it
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(Path(tmp) / "unpacked", **safe)
        (unpacked,) = (Path(tmp) / "unpacked").iterdir()
        wheel = _hook("build_wheel", unpacked, out_dir)
    return sdist, wheel


def shared_build(shared: Path) -> tuple[Path, Path]:
    """:func:`build` once per session in ``shared`` (tests/shared_runs.py's directory), whichever
    worker asks first; the others wait for it."""
    where = shared / "dist"
    with open(shared / "dist.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = where / "built"
        if not done.exists():
            shutil.rmtree(where, ignore_errors=True)
            sdist, wheel = build(where)
            done.write_text(f"{sdist.name}\n{wheel.name}\n")
        sdist_name, wheel_name = done.read_text().split()
    return where / sdist_name, where / wheel_name


# --- venvs ----------------------------------------------------------------------------------

def new_venv(where: Path) -> Path:
    """A venv without pip (this Python's pip installs into it: --python); its interpreter."""
    venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(where)
    return where / "bin" / "python"


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True, env=clean_env())
    return Path(out.stdout.strip())


def _requirements(dist: Distribution) -> Iterable[str]:
    from packaging.requirements import Requirement

    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            yield req.name


def torch_closure() -> list[Distribution]:
    """torch and every installed distribution it requires (on this platform, no extras), and
    numpy where installed (torch uses it when present; the Makefile installs both)."""
    todo, seen, out = ["torch", "numpy"], set(), []
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            if name == "torch":
                raise AssertionError("torch is not installed in the Python running the tests") from None
            continue
        out.append(dist)
        todo.extend(_requirements(dist))
    return out


def link_torch(python: Path) -> Path:
    """Link torch and its requirements into the venv of ``python``; the constraints file that
    pins them (pass it to every pip install there as ``-c``)."""
    site = site_packages(python)
    pins = []
    for dist in torch_closure():
        home = Path(str(dist.locate_file("")))
        tops: set[str] = set()
        for f in dist.files or []:
            parts = Path(str(f)).parts
            if not parts or parts[0] == "..":
                continue  # console scripts: not needed to import it
            if parts[0] == "__pycache__":  # a one-module distribution's bytecode: link the file
                (site / "__pycache__").mkdir(exist_ok=True)
                target = site / "__pycache__" / parts[-1]
                if not target.exists() and (home / f).exists():
                    target.symlink_to(home / f)
                continue
            tops.add(parts[0])
        for top in sorted(tops):
            if (home / top).exists() and not (site / top).exists():
                (site / top).symlink_to(home / top)
        pins.append(f"{dist.metadata['Name']}=={dist.version}")
    constraints = python.parent.parent / "linked-constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    return constraints


def venv_with_torch(where: Path) -> tuple[Path, Path]:
    """A fresh venv that has this Python's torch (linked, not installed): (python, constraints)."""
    python = new_venv(where)
    return python, link_torch(python)


def run(python: Path, *args: str, cwd: Path | str = ROOT, timeout: float = 300,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A command of the venv of ``python`` (``memscope`` is its bin/memscope), the checkout kept
    off its import path."""
    exe = str(python.parent / args[0]) if (python.parent / args[0]).exists() else args[0]
    return subprocess.run([exe, *args[1:]], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=clean_env(**(env or {})))


def wheel_names(wheel: Path) -> list[str]:
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def main(argv: Sequence[str]) -> int:
    """``python tests/packaging_venvs.py DIR``: the sdist and the wheel into DIR (make dist)."""
    if len(argv) != 1:
        print("usage: python tests/packaging_venvs.py OUT_DIR", file=sys.stderr)
        return 2
    for path in build(Path(argv[0]).resolve()):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
