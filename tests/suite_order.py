"""The order in which ``make test`` hands test files to its xdist workers: heaviest first.

``--dist loadfile`` gives each worker one file at a time, in the order of the collection, so the
suite ends when the last file handed out ends. xdist's own order (most tests first) put files of
one or two multi-minute tests (torch.compile, DDP, the trainers) last, on one worker, while the
other one waited. Here the files measured heaviest go first, in order of their cost; then the
other files marked ``slow``; then the rest (cheap, in-process) as xdist would order them. The
Makefile passes ``--no-loadscope-reorder`` so xdist keeps this order.
"""

from __future__ import annotations

import pytest

# Seconds each file took alone (pytest -p no:cacheprovider FILE) on the shared 2-core development
# machine, most of them under a load of 4 to 10, so only the order means much; the files split
# in two are half their file's time.
HEAVY: dict[str, float] = {
    "tests/test_readme_samples_more.py": 370,
    "tests/test_readme_samples.py": 360,
    "tests/test_whatif.py": 315,
    "tests/test_leak_lengths_gpt.py": 250,
    "tests/compat/test_eager.py": 245,
    "tests/test_leak_lengths.py": 230,
    "tests/compat/test_compile.py": 170,
    "tests/compat/test_agent_edges.py": 165,
    "tests/compat/test_frameworks.py": 160,
    "tests/test_advice_accuracy.py": 110,  # under a load of about 2, as the two oom files
    "tests/compat/test_distributed.py": 95,
    "tests/compat/test_options.py": 85,
    "tests/test_oom_at_failure.py": 75,
    "tests/test_oom.py": 55,
}


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def heaviest_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place by file (a file's own items keep their order)."""
    count: dict[str, int] = {}
    slow: set[str] = set()
    for item in items:
        name = _file(item)
        count[name] = count.get(name, 0) + 1
        if item.get_closest_marker("slow") is not None:
            slow.add(name)

    def key(name: str) -> tuple[int, float]:
        if name in HEAVY:
            return (0, -HEAVY[name])
        return (1, -count[name]) if name in slow else (2, -count[name])

    rank = {name: i for i, name in enumerate(sorted(count, key=key))}  # sorted() is stable
    items.sort(key=lambda item: rank[_file(item)])
