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

# Seconds each file's tests took in the suite (the sum of their times in .venv/junit.xml after
# make test; `python tests/suite_order.py .venv/junit.xml` prints this table from it), every file of
# 5 s or more, on the 2-core development machine: only the order matters. Handed out longest first,
# the last files handed out are short ones, and the two workers end within seconds of each other
# (a 30-second file of two tests, ordered by its count, once came last: one worker idle 12 s).
# A file not here comes after these.
HEAVY: dict[str, float] = {
    "tests/test_advice_accuracy.py": 144,
    "tests/test_suggestions.py": 67,
    "tests/test_readme_samples_more.py": 43,
    "tests/test_oom_at_failure.py": 41,
    "tests/test_readme_samples.py": 36,
    "tests/compat/test_compile.py": 36,
    "tests/test_leak_lengths.py": 32,
    "tests/test_sac_curve.py": 32,
    "tests/test_leak_lengths_gpt.py": 29,
    "tests/test_attach.py": 29,
    "tests/test_fit.py": 28,
    "tests/test_calibration.py": 26,
    "tests/tui/test_layout.py": 25,
    "tests/test_lowest_bounds.py": 25,
    "tests/test_node.py": 25,
    "tests/test_real_leaks.py": 24,
    "tests/test_whatif.py": 23,
    "tests/test_leaks.py": 23,
    "tests/test_fake_estimate.py": 21,
    "tests/test_attach_pid.py": 21,
    "tests/compat/test_frameworks.py": 19,
    "tests/faults/test_long_lock.py": 19,
    "tests/test_attach_pid_refusals.py": 19,
    "tests/faults/test_live_file.py": 18,
    "tests/test_layers_accumulation.py": 18,
    "tests/test_oom.py": 17,
    "tests/test_empty_record.py": 17,
    "tests/test_integrations.py": 16,
    "tests/tui/test_conventions_tmux.py": 16,
    "tests/tui/test_views.py": 16,
    "tests/faults/test_corruption.py": 16,
    "tests/test_nothing_lost.py": 15,
    "tests/test_hostile_agent.py": 14,
    "tests/test_signals_live.py": 14,
    "tests/tui/test_attach_tmux.py": 13,
    "tests/test_layers.py": 13,
    "tests/test_sac_default.py": 13,
    "tests/compat/test_distributed.py": 12,
    "tests/faults/test_disk_faults.py": 11,
    "tests/tui/test_hostile_views.py": 11,
    "tests/test_peak_step.py": 10,
    "tests/test_mutations.py": 10,
    "tests/faults/test_kills.py": 10,
    "tests/compat/test_options.py": 10,
    "tests/compat/test_eager.py": 10,
    "tests/test_sac_limits.py": 10,
    "tests/test_packaging.py": 10,
    "tests/test_framework_advice.py": 9,
    "tests/compat/test_agent_edges.py": 9,
    "tests/tui/test_plot_snapshots.py": 9,
    "tests/tui/test_app.py": 9,
    "tests/test_sac_fit.py": 8,
    "tests/test_advice_cases.py": 8,
    "tests/test_leak_patch.py": 8,
    "tests/test_fake_side_effects.py": 8,
    "tests/faults/test_attach_paths.py": 8,
    "tests/test_script_estimate.py": 8,
    "tests/test_damaged_values.py": 8,
    "tests/tui/test_attach_pid_tmux.py": 8,
    "tests/test_layers_checkpoint.py": 8,
    "tests/test_live_counters.py": 7,
    "tests/test_file_growth.py": 7,
    "tests/test_hostile_corpus.py": 7,
    "tests/tui/test_snapshots.py": 7,
    "tests/faults/test_writer_faults.py": 7,
    "tests/test_secrets.py": 7,
    "tests/test_leak_gc_off.py": 6,
    "tests/test_merge.py": 6,
    "tests/test_evaluation_marks.py": 6,
    "tests/test_oom_limits.py": 6,
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


def table(junit: str, least: float = 5.0) -> dict[str, float]:
    """HEAVY from a junit file of a whole run: each test file's seconds, longest first."""
    import os
    import xml.etree.ElementTree as ET

    root = ET.parse(junit).getroot()
    seconds: dict[str, float] = {}
    for case in root.iter("testcase"):
        parts = case.get("classname", "").split(".")
        name = next((p for p in ("/".join(parts[:i]) + ".py" for i in range(len(parts), 0, -1))
                     if os.path.exists(p)), None)  # tests.tui.test_x[.Class] -> tests/tui/test_x.py
        if name is not None:
            seconds[name] = seconds.get(name, 0.0) + float(case.get("time", 0))
    return {k: round(v) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1]) if v >= least}


if __name__ == "__main__":
    import sys

    for name, secs in table(sys.argv[1] if len(sys.argv) > 1 else ".venv/junit.xml").items():
        print(f'    "{name}": {secs},')
