"""Whether the ``memscope`` package Python imports is torch-memscope's.

The name ``memscope`` on the package index is an unrelated project (C/C++ memory analysis) whose
distribution installs its own ``memscope/__init__.py``. Installed after torch-memscope it replaces
our ``__init__`` while our subpackages stay beside it, and every command failed with
``ImportError: cannot import name '__version__'``; uninstalled later, it takes our ``__init__``
with it. The import package keeps its name (renaming it would break every ``import memscope``):
the command checks the mark our ``__init__`` carries before it reads anything else from it, and
says in one line what happened and what fixes it. Floor: imports nothing of memscope.
"""

from __future__ import annotations

import sys

DISTRIBUTION = "torch-memscope"
FIX = "pip uninstall memscope && pip install --force-reinstall torch-memscope"


def clash() -> str | None:
    """None when ``memscope`` is ours (its ``__init__`` carries our mark); else the line to say."""
    package = sys.modules.get("memscope")
    if getattr(package, "__distribution__", None) == DISTRIBUTION:
        return None
    where = getattr(package, "__file__", None)
    if where is None:
        what = "its __init__.py is missing (uninstalling another distribution that shipped one removed ours)"
        where = next(iter(getattr(package, "__path__", None) or ["?"]))
    else:
        other = _other_distribution()
        what = (f"the unrelated {other} distribution installed its own memscope/__init__.py over ours"
                if other else "its __init__.py is another project's")
    return f"the memscope package Python imports ({where}) is not torch-memscope's: {what}; fix: {FIX}"


def exit_if_not_ours() -> None:
    """One line on stderr and exit status 2 when ``memscope`` is not ours (no traceback)."""
    line = clash()
    if line is not None:
        print(f"memscope: error: {line}", file=sys.stderr)
        raise SystemExit(2)


def _other_distribution() -> str | None:
    """``memscope 0.1.2`` when an installed distribution named memscope ships memscope/__init__.py."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("memscope")
    except (ImportError, PackageNotFoundError):
        return None
    except Exception:  # noqa: BLE001 - damaged metadata: the line still says what to do
        return None
    files = dist.files or []
    if not any(str(f).replace("\\", "/") == "memscope/__init__.py" for f in files):
        return None
    return f"{dist.metadata['Name'] or 'memscope'} {dist.version}"
