"""The agent knows which ``torch.compile(module)`` results are alive without a walk over every
object at each profiled step (that walk cost 30 ms after a bare ``import torch`` and made a
1 ms training step 3x slower at default options)."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from memscope.agent.torchcompat import compiled  # noqa: E402


def test_modules_compiled_before_and_after_start_are_seen_and_not_kept() -> None:
    before = torch.compile(torch.nn.Linear(4, 4), backend="eager")  # built, never called
    seen = compiled.CompiledSeen()
    seen.start()
    try:
        assert seen.alive() == [before]  # the one scan at start
        after = torch.compile(torch.nn.Linear(4, 4), backend="eager")
        assert set(map(id, seen.alive())) == {id(before), id(after)}
        calls = []
        real = compiled._scan_optimized_modules
        compiled._scan_optimized_modules = lambda: calls.append(1) or real()  # type: ignore[assignment]
        try:
            seen.alive()
            assert calls == []  # answered from what it saw, not from a scan
        finally:
            compiled._scan_optimized_modules = real  # type: ignore[assignment]
        del before, after
        gc.collect()
        assert seen.alive() == []  # weak references: memscope keeps no module alive
    finally:
        seen.stop()
    assert seen.alive() == []  # stopped: a scan again, and nothing is left
