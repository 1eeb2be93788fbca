"""Every output sample in README.md and docs/*.md is what the program prints today.

The samples are rerun from real runs, each group of samples from one run (tests/doc_samples.py
says how samples are marked and which numbers are masked: dates, durations, the sampler's sample
count, host RSS figures, the machine's memory size and temporary paths — what differs between
two runs of the same command). After a change of output, refresh them all with

    .venv/bin/python tests/test_readme_samples.py --update [GROUP ...]

and read the diff before committing it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import doc_samples as ds  # noqa: E402
from shared_runs import shared_attach, shared_ddp  # noqa: E402

BLOCKS = ds.all_blocks()


def ds_shared(tmp_path_factory: pytest.TempPathFactory) -> Callable[[ds.Shared], Path]:
    """A group's setup run that other tests make too: the session's run (tests/shared_runs.py)."""
    def get(run: ds.Shared) -> Path:
        if run.ddp:
            db, _ = shared_ddp(tmp_path_factory, *run.command)
        else:
            db, _ = shared_attach(tmp_path_factory, list(run.options), list(run.command))
        return db
    return get


GROUP_NAMES = sorted({b.group for b in BLOCKS})


@pytest.mark.slow
@pytest.mark.timeout(600)  # a group is several real runs, on a loaded 2-core machine
@pytest.mark.parametrize("group", [g for g in GROUP_NAMES if g not in ds.SECOND_FILE])
def test_samples_are_what_the_program_prints(group: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """This file's half of the groups (the other half: tests/test_readme_samples_more.py)."""
    problems = ds.stale(group, BLOCKS, ds_shared(tmp_path_factory))
    assert not problems, ("stale samples (refresh: python tests/test_readme_samples.py --update "
                          f"{group}):\n\n" + "\n\n".join(problems))


def test_every_sample_group_has_a_setup_and_every_setup_a_sample() -> None:
    assert set(GROUP_NAMES) == set(ds.GROUPS), sorted(set(GROUP_NAMES) ^ set(ds.GROUPS))
    assert ds.SECOND_FILE <= set(GROUP_NAMES), sorted(ds.SECOND_FILE - set(GROUP_NAMES))  # each group rerun once


def test_the_docs_have_samples_of_every_main_command() -> None:
    readme = [b for b in BLOCKS if b.path.name == "README.md"]
    commands = {cmd.split()[1] for b in readme for cmd, _ in b.commands}
    assert {"report", "leaks", "oom", "layers", "fit"} <= commands, commands
    assert len(BLOCKS) >= 20, len(BLOCKS)


# Samples a setting the samples' runner cannot make reruns instead (a venv with the unrelated
# memscope distribution installed over ours): (doc, the output's first words) -> the test's file.
RERUN_ELSEWHERE = {("getting-started.md", "memscope: error: the memscope package Python imports"):
                   "tests/test_packaging.py"}


def test_every_console_block_with_output_is_a_rerun_sample() -> None:
    """A block that shows `$ memscope ...` followed by its output is marked, so it is rerun."""
    for path in ds.DOCS:
        lines = path.read_text().splitlines()
        opening = [i for i, line in enumerate(lines) if line.startswith("```")][::2]
        for i in opening:
            body = lines[i + 1:i + 3]
            if len(body) == 2 and body[0].startswith("$ memscope") and not body[1].startswith(("$", "```")):
                elsewhere = next((test for (doc, start), test in RERUN_ELSEWHERE.items()
                                  if doc == path.name and body[1].startswith(start)), None)
                if elsewhere is not None:  # that test compares the block with what it ran
                    assert path.name in (ds.ROOT / elsewhere).read_text(), elsewhere
                    continue
                assert ds.MARKER.match(lines[i - 1]), f"{path.name}:{i + 1}: an output sample that is not rerun"


def test_the_oom_script_shown_is_the_one_run() -> None:
    text = (ds.ROOT / "docs" / "oom.md").read_text()
    source = (ds.ROOT / "examples" / "double_batch.py").read_text()
    assert "```python\n" + source + "```" in text


def test_masking_keeps_what_must_not_change() -> None:
    """The comparison is not vacuous: a changed word, byte count, step, verdict or a missing line
    fails; a changed duration, date or host RSS does not."""
    doc = ["steps     30 completed (boundaries: optimizer), median 60 ms/step",
           "peak      336.38 MiB host RSS at step 23",
           "  blocks.0.attn   NaiveAttention   900.00 KiB  15.2%  128.00 KiB        0.99         0.74      1",
           "leaks     none in 28 inventories"]
    same = ["steps     30 completed (boundaries: optimizer), median 112 ms/step",
            "peak      1.02 GiB host RSS at step 3",
            "  blocks.0.attn   NaiveAttention   900.00 KiB  15.2%  128.00 KiB       10.25            -      1",
            "leaks     none in 28 inventories"]
    assert ds.differences(doc, same) == []
    row = "  blocks.0.attn   NaiveAttention   {} KiB  15.2%  128.00 KiB        0.99         0.74      {}"
    for k, stale in ((0, "steps     29 completed (boundaries: optimizer), median 60 ms/step"),
                     (1, "peak      336.38 MiB device memory at step 23"),
                     (2, row.format("901.00", 1)),
                     (2, row.format("900.00", 2)),
                     (3, "leaks     1 found")):
        assert ds.differences(doc, doc[:k] + [stale] + doc[k + 1:]), stale
    assert ds.differences(doc, doc[:-1])
    # a line only some machines print is left out on both sides, and nothing else is
    optional = "336.00 MiB at most over the whole run, outside the steps (start-up, evaluation, shutdown)"
    assert ds.differences(doc, doc[:2] + [optional] + doc[2:]) == []
    assert ds.differences(doc, doc[:2] + ["a line the docs do not have"] + doc[2:])
    # a temporary directory's random name is masked whole, whatever it ends with
    assert ds.differences(["run files: /tmp/memscope-whatif-abc"], ["run files: /tmp/memscope-whatif-zt29yl8s"]) == []


def test_options_shorten_the_output_as_documented() -> None:
    out = "a 1\nb 2\nc 3\nd " + "word " * 30 + "\n"
    assert ds.shown(out, {"grep": "^[ac]"}) == ["a 1", "...", "c 3", "..."]
    assert ds.shown(out, {"head": "2"}) == ["a 1", "b 2", "..."]
    cut = ds.shown(out, {"cut": "40"})[-1]
    assert cut.endswith(" ...") and len(cut) <= 44


def test_markers_parse() -> None:
    assert all(re.fullmatch(r"[a-z_]+", b.group) for b in BLOCKS)
    assert all(b.commands for b in BLOCKS)


if __name__ == "__main__":
    if sys.argv[1:2] != ["--update"]:
        sys.exit(__doc__)
    ds.update(sys.argv[2:] or None)
