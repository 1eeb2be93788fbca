"""The CUDA interface. Parsing is tested on CPU; the real allocator only with a GPU."""

from __future__ import annotations

import pytest

from memscope.agent.collectors.cuda import STAT_COLUMNS, parse_memory_stats


def test_parse_keeps_known_counters_and_marks_missing() -> None:
    # Built by hand from the key names torch.cuda.memory_stats() documents (not a GPU capture).
    stats = {"allocated_bytes.all.current": 1024, "allocated_bytes.all.peak": 4096,
             "reserved_bytes.all.current": 2 << 20, "num_ooms": 0, "unrelated.key": 7}
    row = parse_memory_stats(stats)
    assert set(row) == set(STAT_COLUMNS.values())
    assert row["allocated"] == 1024 and row["allocated_peak"] == 4096
    assert row["reserved"] == 2 << 20 and row["ooms"] == 0
    assert row["active"] is None


@pytest.mark.cuda
def test_real_allocator_counters() -> None:
    import torch

    from memscope.agent.collectors.cuda import cuda_devices_in_use, read_device_stats

    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    assert 0 in cuda_devices_in_use()
    row = read_device_stats(0)
    assert row["allocated"] >= x.numel() and row["reserved"] >= row["allocated"]
    assert all(row[c] is not None for c in STAT_COLUMNS.values())
