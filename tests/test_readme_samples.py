"""The README's output samples are what the program prints today.

Each sample is compared with a fresh run of the same command, numbers and sizes masked (sizes,
times, dates and where the host RSS peak fell differ between runs and machines; words, columns
and verdicts must not). A README line that
ends in ``...`` only has to start the output line; a line of just ``...`` stands for lines left
out. When this fails, paste the output it shows into the README.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT, memscope

README = (ROOT / "README.md").read_text()
_SIZE = re.compile(r"[-+]?\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB)\b")  # its unit moves with its size
_NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*")
# wording that follows where the host RSS peak fell (a step, which step), not the program
_WHERE = re.compile(r"\(measured at [^)]*\)")
# lines whose presence depends on the machine (host RSS outside the steps), not on the program
_OPTIONAL = [re.compile(r"^SIZE at most over the whole run")]


_PATH = re.compile(r"(?<![\w.])/[^\s,;)]+")  # absolute paths: a temporary directory's name


def _mask(line: str) -> str:
    line = _WHERE.sub("(measured at …)", _SIZE.sub("SIZE", _PATH.sub("PATH", line)))
    return " ".join(_NUMBER.sub("#", line).split())


def sample_after(marker: str) -> list[str]:
    """The lines of the first fenced output block at or after ``marker`` in the README."""
    at = README.index(marker)
    lines = README[at:].splitlines()
    if lines[0].startswith("$ "):  # the command is the block's first line: its output follows
        body = []
        for line in lines[1:]:
            if line.startswith("```"):
                return body
            body.append(line)
    start = next(i for i, ln in enumerate(lines) if ln == "```" and i > 0 and lines[i - 1] == "")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    return lines[start + 1:end]


def check(sample: list[str], output: str) -> None:
    """Every sample line, masked, matches an output line in order (the output may have more)."""
    out = [_mask(ln) for ln in output.splitlines()]
    i = 0
    for line in sample:
        want = _mask(line)
        if want in ("...", ""):
            continue
        prefix = want.endswith("...")
        want = want.removesuffix("...").rstrip()
        j = i
        while j < len(out) and not (out[j].startswith(want) if prefix else out[j] == want):
            j += 1
        if j == len(out):
            if any(p.match(want) for p in _OPTIONAL):
                continue
            pytest.fail(f"README line not in the output (masked): {want!r}\n--- output:\n{output}")
        i = j + 1


def attached(db: Path, *command: str) -> Path:
    out = memscope("attach", "--headless", "--db", str(db), *command)
    assert out.returncode == 0, out.stderr
    return db


def output_of(*args: str) -> str:
    out = memscope(*args)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.slow
def test_report_and_layers_samples(tmp_path: Path) -> None:
    db = attached(tmp_path / "run.db", "examples/tiny_gpt.py", "--steps", "30")
    check(sample_after("memscope report run.db --json   # the memscope.report/1 document"),
          output_of("report", str(db)))
    check(sample_after("memscope layers run.db --json\n"), output_of("layers", str(db)))


@pytest.mark.slow
def test_leaks_sample(tmp_path: Path) -> None:
    db = attached(tmp_path / "run.db", "examples/leaky.py", "--steps", "40")
    check(sample_after("memscope leaks RUN.db --json\n"), output_of("leaks", str(db)))


@pytest.mark.slow
def test_whatif_sample(tmp_path: Path) -> None:
    out = memscope("whatif", "--db-dir", str(tmp_path), "examples/tiny_gpt.py", timeout=600)
    assert out.returncode == 0, out.stderr
    check(sample_after("$ memscope whatif examples/tiny_gpt.py"), out.stdout)


def test_the_check_catches_a_stale_sample() -> None:
    """The comparison is not vacuous: a changed word, a missing line or a changed verdict fails."""
    output = "peak      338.07 MiB host RSS at step 27\nleaks     none in 12 inventories\n"
    check(["peak      1.5 MiB host RSS at step 3", "leaks     none in 4 inventories"], output)
    for stale in (["peak      338.07 MiB host RSS at step 27", "leaks     2 found"],
                  ["peak      338.07 MiB device memory at step 27"],
                  ["leaks     none in 12 inventories", "peak      338.07 MiB host RSS at step 27"]):
        with pytest.raises(pytest.fail.Exception):
            check(stale, output)


@pytest.mark.slow
def test_checkpointing_layers_sample(tmp_path: Path) -> None:
    db = attached(tmp_path / "ckpt.db", "tests/compat/cases/checkpointing.py", str(tmp_path / "out.pt"))
    check(sample_after("$ memscope layers ckpt.db\n"), output_of("layers", str(db)))


@pytest.mark.slow
def test_accumulation_samples(tmp_path: Path) -> None:
    from test_layers_accumulation import SCRIPT

    script = tmp_path / "accumulate.py"
    script.write_text(SCRIPT)
    db = attached(tmp_path / "acc.db", str(script), "16,64,32,8")
    sample = sample_after("$ memscope layers acc.db\n")
    cut = sample.index("$ memscope report acc.db")
    check(sample[:cut], output_of("layers", str(db)))
    check(sample[cut + 1:], output_of("report", str(db)))
