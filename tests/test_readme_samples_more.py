"""The other half of the sample groups of tests/test_readme_samples.py (``SECOND_FILE`` in
tests/doc_samples.py): a second file so make test's two workers rerun both halves side by side."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import doc_samples as ds  # noqa: E402
from test_readme_samples import ds_shared  # noqa: E402

BLOCKS = ds.all_blocks()


@pytest.mark.slow
@pytest.mark.timeout(600)  # a group is several real runs, on a loaded 2-core machine
@pytest.mark.parametrize("group", sorted(ds.SECOND_FILE))
def test_samples_are_what_the_program_prints(group: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    problems = ds.stale(group, BLOCKS, ds_shared(tmp_path_factory))
    assert not problems, ("stale samples (refresh: python tests/test_readme_samples.py --update "
                          f"{group}):\n\n" + "\n\n".join(problems))
