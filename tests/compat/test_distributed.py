"""DDP and FSDP2 (``fully_shard``) on CPU with gloo, two ranks under torchrun: plain torchrun,
``memscope attach -- torchrun ...``, and attach at its most invasive settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import check, layer_rows, run_three

STEPS = 8


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["ddp", "fsdp2"])
def test_two_ranks(tmp_path: Path, variant: str) -> None:
    if variant == "fsdp2":
        pytest.importorskip("torch.distributed.fsdp", reason="no FSDP in this torch")
        from torch.distributed import fsdp

        if not hasattr(fsdp, "fully_shard"):
            pytest.skip("this torch has no FSDP2 fully_shard")
    arms = run_three(tmp_path, "distributed.py", [variant], torchrun=2)
    check(arms, tmp_path, STEPS, processes=2)
    assert set(arms["plain"].out) == {"rank0", "rank1"}
    rows = layer_rows(arms["invasive"].db)
    # the model's own names, through the DDP wrapper too
    assert {"", "0", "2", "4"} <= set(rows), sorted(rows)
    assert not [m for m in rows if m.startswith(("module", "<")) and m != "<no module>"], sorted(rows)
