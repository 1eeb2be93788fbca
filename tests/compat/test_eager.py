"""Eager-mode features a training script may use, each run plain, under attach, and under
attach at its most invasive settings (see harness.py for what is compared)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import check, layer_rows, run_three

STEPS = 8


@pytest.mark.parametrize("script", [
    "checkpointing.py", "autocast.py", "functional_call.py", "user_hooks.py",
    "channels_last.py", "complex_sparse.py", "thread_loop.py",
])
def test_eager_feature(tmp_path: Path, script: str) -> None:
    arms = run_three(tmp_path, script)
    check(arms, tmp_path, STEPS)
    rows = layer_rows(arms["invasive"].db)
    assert rows, "no module was profiled"
    if script == "user_hooks.py":  # the script's own hooks ran as often under memscope
        seen = arms["plain"].out["seen"]
        assert seen["pre"] == seen["post"] == STEPS and seen["backward"] == STEPS
        assert seen["packed"] > 0 and seen["unpacked"] > 0
    if script == "checkpointing.py":
        # checkpointed blocks keep their names and each shows what checkpointing keeps (its
        # input: 16 x 32 float32), reentrant (block_a) or not (block_b, the first segment of
        # checkpoint_sequential); what they recompute in backward is not a row or a call
        assert {"block_a", "block_b", "tail.0", "stem", "head"} <= set(rows), sorted(rows)
        for name in ("block_a", "block_b", "tail.0"):
            assert rows[name][1:] == (1, 16 * 32 * 4), (name, rows[name])
        assert rows[""][2] == 0  # the caller keeps nothing of its own
        assert not [m for m in rows if m.startswith("<") and m != "<no module>"], sorted(rows)
        assert all(calls == 1 for m, (_, calls, _) in rows.items() if m != "<no module>"), rows
