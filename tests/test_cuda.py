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
    # the direct read of the nested counters is the public memory_stats(), column for column
    assert row == parse_memory_stats(torch.cuda.memory_stats(0))
    from memscope.agent.collectors.cuda import allocated_and_peak

    assert allocated_and_peak() == (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated())
    del x


def nest(flat: dict[str, object]) -> dict[str, object]:
    """memory_stats()'s flat keys back into the allocator's nested dict."""
    out: dict[str, object] = {}
    for key, value in flat.items():
        node = out
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})  # type: ignore[assignment]
        node[last] = value
    return out


def test_nested_counters_read_as_the_flat_ones() -> None:
    """Every reading captured on an H100 (tests/data/cuda_memory_stats_real.json): the nested
    dict the sampler reads gives the same columns as torch's flattened memory_stats()."""
    import json
    from pathlib import Path

    from memscope.agent.collectors.cuda import parse_nested_stats

    capture = json.loads((Path(__file__).parent / "data" / "cuda_memory_stats_real.json").read_text())
    assert capture["readings"]
    for name, reading in capture["readings"].items():
        flat = reading["memory_stats"]
        want = parse_memory_stats(flat)
        assert all(v is not None for v in want.values()), name
        assert parse_nested_stats(nest(flat)) == want, name


def test_the_estimate_on_a_gpu_is_the_one_the_docs_give() -> None:
    """docs/measured.md quotes the GPU capture of make gpu-check (cuda_estimate_real.json)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    doc = json.loads((root / "tests" / "data" / "cuda_estimate_real.json").read_text())
    real, est = doc["real_max_allocated"], doc["on_the_gpu"]["cuda_peak"]
    text = " ".join((root / "docs" / "measured.md").read_text().split())
    assert f"estimated {est / 2 ** 20:.1f} MiB" in text
    assert f"`max_memory_allocated` {real / 2 ** 20:.1f} MiB ({est / real - 1:+.1%})" in text
