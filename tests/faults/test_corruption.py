"""A seeded corruption fuzzer: damaged copies of real run files through every reading command.

Two real runs (a leaking one with inventories and layer rows, one that hits an OOM) are
damaged ``VARIANTS`` ways (tests/faults/corrupt.py: flipped bytes, truncation, odd values in
columns, dropped tables and columns, a lying version, foreign files). Every reading command
(report, report --json/--html, leaks, oom, layers, export, diff; and the dashboard's reader)
runs on each, in-process for speed, with a handful of real subprocess runs beside. Asserted:
no traceback, no internal error, no hang; exit 0, or exit 2 with one line saying why; the
files are never changed by a reader; ``integrity_check`` stays ok where the test did not break
the file's bytes itself; a file missing a table or column its version promises is refused.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from memscope.store.schema import RunFileError
from conftest import EXAMPLES, memscope
from faults.corrupt import Variant, integrity_ok, make_variant
from faults.fuzz import commands, digest, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

VARIANTS = 200  # seeds 0..VARIANTS-1, split between the two base runs


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory, oom_example_run: Path) -> list[Path]:
    """A leaking run made here, and examples/oom.py's run that the export and dashboard tests
    read too (made once per session: tests/conftest.py). Never changed: each variant is a copy."""
    d = tmp_path_factory.mktemp("bases")
    leak, oom = d / "leak.db", oom_example_run
    res = memscope("attach", "--headless", "--db", str(leak), "--inventory-every", "2",
                   "--layers-every", "3", str(EXAMPLES / "leaky.py"), "--steps", "12",
                   "--width", "64", "--batch", "16", timeout=300)
    assert res.returncode == 0, res.stderr
    for base in (leak, oom):
        assert integrity_ok(base) is True
        assert not Path(str(base) + "-wal").exists()  # self-contained at the end
    return [leak, oom]


def _tui_problem(db: Path) -> str | None:
    """The dashboard's reader on a damaged file: a RunFileError (shown as a notice), else fine."""
    from memscope_tui.data import load_snapshot

    try:
        snap = load_snapshot(str(db))
    except RunFileError:
        return None
    except Exception as exc:  # noqa: BLE001 - the finding
        return f"dashboard reader raised {type(exc).__name__}: {exc}"
    if snap.suggestions.error:
        return f"dashboard suggestions failed: {snap.suggestions.error}"
    return None


def _schema_says_damaged(v: Variant) -> bool:
    """Variants that remove a table or column the file's version promises."""
    return any(f":schema:{k}:" in v.name for k in ("drop_table", "drop_column", "rename_table"))


def test_every_reading_command_survives_damaged_files(bases: list[Path], tmp_path: Path) -> None:
    problems: list[str] = []
    runs = exit2 = 0
    for seed in range(VARIANTS):
        base, other = bases[seed % 2], bases[(seed + 1) % 2]
        v = make_variant(base, tmp_path, seed)
        before = digest(v.path)
        clean_before = None if v.damaged_bytes else integrity_ok(v.path)
        for argv in commands(v.path, other, tmp_path):
            o = run(argv)
            runs += 1
            exit2 += o.code == 2
            if o.problem:
                problems.append(f"{v.name}: memscope {' '.join(argv)}: {o.problem}")
            elif _schema_says_damaged(v) and o.code != 2:
                problems.append(f"{v.name}: memscope {' '.join(argv)}: read a file missing part "
                                "of its schema as if it were fine")
            elif o.code == 2 and str(v.path) not in o.err and "--json" not in argv[:1]:
                if argv[0] != "diff":  # diff names whichever of its two files failed
                    problems.append(f"{v.name}: {argv}: the error does not name the file: {o.err}")
        tui = _tui_problem(v.path)
        if tui:
            problems.append(f"{v.name}: {tui}")
        if digest(v.path) != before:
            problems.append(f"{v.name}: a reader changed the file")
        if clean_before:
            assert integrity_ok(v.path) is True, v.name
    assert not problems, f"{len(problems)} of {runs} command runs misbehaved:\n" + "\n".join(problems[:40])
    assert runs >= 200 * len(commands(Path("x"), Path("y"), tmp_path))
    assert 0.2 * runs < exit2 < 0.9 * runs  # the damage is real, and much of it still reads


def test_a_few_damaged_files_through_the_real_command(bases: list[Path], tmp_path: Path) -> None:
    """The same promise from a real process (what a user sees), for one of each damage kind."""
    picked: dict[str, Variant] = {}
    for seed in range(VARIANTS):
        v = make_variant(bases[seed % 2], tmp_path, seed)
        kind = v.name.split(":")[1]
        if kind not in picked:
            picked[kind] = v
        else:
            v.path.unlink()
    assert {"flip", "truncate", "value", "schema", "foreign"} <= set(picked)
    for i, v in enumerate(picked.values()):
        for argv in (["report", str(v.path)], ["leaks", str(v.path), "--json"])[i % 2:][:1]:
            res = memscope(*argv, timeout=120)
            assert "Traceback" not in res.stderr, (v.name, res.stderr)
            assert res.returncode in (0, 2), (v.name, res.returncode, res.stderr)
            if res.returncode == 2:
                lines = res.stderr.strip().splitlines()
                assert len(lines) == 1 and lines[0].startswith("memscope: error: "), (v.name, res.stderr)


def test_a_version_4_file_missing_a_table_is_damaged_not_old(bases: list[Path], tmp_path: Path) -> None:
    import shutil
    import sqlite3

    for table in ("layer_stats", "inventories"):
        db = tmp_path / f"no-{table}.db"
        shutil.copyfile(bases[0], db)
        with sqlite3.connect(db) as conn:
            conn.execute(f"DROP TABLE {table}")
        for argv in (["report", str(db)], ["leaks", str(db)], ["layers", str(db)]):
            o = run(argv)
            assert o.code == 2 and "damaged" in o.err and table in o.err, (argv, o.err)
    out = subprocess.run([sys.executable, "-m", "memscope", "report", str(db)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "inventories" in out.stderr
