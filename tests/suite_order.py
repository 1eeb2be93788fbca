"""The order in which ``make test`` hands test files to its xdist workers: heaviest first.

``--dist loadfile`` gives each worker one file at a time, in the order of the collection, so the
suite ends when the last file handed out ends. xdist's own order (most tests first) put files of
one to three long tests (torch.compile, DDP, the trainers) last, on one worker, while the
other one waited. Here the files measured heaviest go first, in order of their cost; then the
other files marked ``slow``; then the rest (cheap, in-process) as xdist would order them. The
Makefile passes ``--no-loadscope-reorder`` so xdist keeps this order.
"""

from __future__ import annotations

import pytest

# Seconds each file took alone (pytest -p no:cacheprovider FILE) on the 2-core development
# machine under a load below 2 (under the load of other jobs, 3 to 5 times as long); only the
# order matters. A file not here comes after these.
HEAVY: dict[str, float] = {
    "tests/test_advice_accuracy.py": 158,
    "tests/test_sac_curve.py": 106,
    "tests/test_readme_samples.py": 64,  # with accumulate (doc_samples.SECOND_FILE); b.db a copy (56 -> 49 s here)
    "tests/test_oom_at_failure.py": 71,
    "tests/test_leak_lengths.py": 62,
    "tests/test_readme_samples_more.py": 60,  # fit's command run once, not twice (84 before)
    "tests/test_leak_lengths_gpt.py": 57,
    "tests/test_oom.py": 51,
    "tests/compat/test_compile.py": 50,
    "tests/test_whatif.py": 35,
    "tests/compat/test_frameworks.py": 24,
    "tests/compat/test_eager.py": 20,  # six cases per process (43 before)
    "tests/compat/test_options.py": 19,
    "tests/compat/test_distributed.py": 16,
    "tests/compat/test_agent_edges.py": 13,
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
