"""Test-only: plants a known 1% error into one of memscope's measurements (tests/test_mutations.py).

Put first on PYTHONPATH with ``TEST_MUTANT`` naming the mutant, it runs in every Python
process of a test (pytest, ``memscope attach``'s child through the bootstrap's chain to the next
``sitecustomize``): when the target module is imported, the measurement is
wrapped to come out 1% high, and each planted result appends a line to
``TEST_MUTANT_LOG``, so the test knows the error reached the number it checks.

Nothing in memscope/ knows about this file: it exists only in the tests.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any, Callable

MUTANT = os.environ.get("TEST_MUTANT", "")
ERROR = 1.01
# "mutant=nodeid,...": several mutants planted in one pytest run, each firing only while its own
# test runs (PYTEST_CURRENT_TEST, which a test's subprocesses inherit), so a test can fail only
# by its own mutant; "mutant" alone fires everywhere
_ONLY_IN = {part.partition("=")[0]: part.partition("=")[2] for part in MUTANT.split(",") if part}


def _fires(what: str) -> bool:
    test = _ONLY_IN.get(what)
    return test == "" or (test is not None and os.environ.get("PYTEST_CURRENT_TEST", "").startswith(test + " "))


def _planted(what: str) -> None:
    log = os.environ.get("TEST_MUTANT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{what} {os.getpid()}\n")


def _fake_peak(mod: Any) -> None:
    """The fake run's live-tensor peak as the runner hands it on (memscope estimate, fit, the
    accuracy table). Planted in the runner: the fake run's worker runs as ``__main__`` and gets
    an environment without test variables."""
    orig = mod.FakeResult.peak.fget

    def peak(self: Any) -> int:
        value = orig(self)
        if not _fires("fake_peak"):
            return value
        if value:
            _planted("fake_peak")
        return round(value * ERROR)
    mod.FakeResult.peak = property(peak)


def _census_activations(mod: Any) -> None:
    """The at-failure OOM census's activations (imported by memscope.agent.collectors.oom after this)."""
    orig = mod.census

    def census(*args: Any, **kw: Any) -> Any:
        out = orig(*args, **kw)
        if out and out.get("activations") and _fires("census_activations"):
            out["activations"] = round(out["activations"] * ERROR)
            _planted("census_activations")
        return out
    mod.census = census


def _layer_bytes(mod: Any) -> None:
    """The bytes each module saved for backward (memscope layers, hotspots)."""
    orig = mod.LayerProfiler.end

    def end(self: Any) -> Any:
        stats = orig(self)
        if not _fires("layer_bytes"):
            return stats
        for st in stats:
            if st.saved_bytes:
                st.saved_bytes = round(st.saved_bytes * ERROR)
                _planted("layer_bytes")
        return stats
    mod.LayerProfiler.end = end


MUTANTS: dict[str, tuple[str, Callable[[Any], None]]] = {
    "fake_peak": ("memscope.runners.fake_estimate", _fake_peak),
    "census_activations": ("memscope.agent.collectors.oom_census", _census_activations),
    "layer_bytes": ("memscope.agent.collectors.layers", _layer_bytes),
}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, plant: Callable[[Any], None]) -> None:
        self.inner, self.plant = inner, plant

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        self.plant(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        plants = [MUTANTS[m][1] for m in _ONLY_IN if m in MUTANTS and MUTANTS[m][0] == name]
        if not plants:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, plants[0])
        return spec


if MUTANT:
    sys.meta_path.insert(0, _Finder())
