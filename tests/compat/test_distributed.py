"""DDP and FSDP2 (``fully_shard``) on CPU with gloo, two ranks under torchrun: plain torchrun,
``memscope attach -- torchrun ...``, and attach at its most invasive settings. Both variants run
one after another in one torchrun per arm (cases/distributed.py); each test reads its variant's
steps and layer rows from that one run."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from harness import check, layer_rows, run_three

STEPS = 8


def _has_fsdp2() -> bool:
    if importlib.util.find_spec("torch.distributed.fsdp") is None:
        return False
    from torch.distributed import fsdp

    return hasattr(fsdp, "fully_shard")


VARIANTS = ["ddp", "fsdp2"] if _has_fsdp2() else ["ddp"]


@pytest.fixture(scope="module")
def arms(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    tmp_path = tmp_path_factory.mktemp("distributed")
    return run_three(tmp_path, "distributed.py", VARIANTS, torchrun=2), tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["ddp", "fsdp2"])
def test_two_ranks(arms: tuple[dict[str, Any], Path], variant: str) -> None:
    if variant not in VARIANTS:
        pytest.skip("this torch has no FSDP2 fully_shard")
    runs, tmp_path = arms
    check(runs, tmp_path, STEPS * len(VARIANTS), processes=2)
    assert set(runs["plain"].out) == {"rank0", "rank1"}
    rows = layer_rows(runs["invasive"].db, step=STEPS * VARIANTS.index(variant) + STEPS - 1)
    # the model's own names, through the DDP wrapper too
    assert {"", "0", "2", "4"} <= set(rows), sorted(rows)
    assert not [m for m in rows if m.startswith(("module", "<")) and m != "<no module>"], sorted(rows)
