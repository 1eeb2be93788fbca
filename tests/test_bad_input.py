"""Bad input: one clear line on stderr, a non-zero exit, no traceback, no data lost."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from conftest import SCRIPTS, memscope
from memscope.store.schema import SCHEMA_VERSION
from shared_runs import shared_attach, shared_loop


def one_error_line(out) -> str:  # type: ignore[no-untyped-def]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("memscope: error: ")
    assert "Traceback" not in out.stderr
    return lines[0]


def test_missing_script(tmp_path: Path) -> None:
    out = memscope("attach", "--db", str(tmp_path / "r.db"), "nope.py")
    assert out.returncode == 2
    assert "no such script: nope.py" in one_error_line(out)
    assert not (tmp_path / "r.db").exists()


def test_unknown_command_and_option(tmp_path: Path) -> None:
    out = memscope("frobnicate")
    assert out.returncode == 2 and "frobnicate" in one_error_line(out)
    out = memscope("attach", "--bogus", str(SCRIPTS / "loop.py"))
    assert out.returncode == 2 and "--bogus" in one_error_line(out)
    out = memscope("attach", "--", "no-such-program-xyz")
    assert out.returncode == 2 and "command not found" in one_error_line(out)
    out = memscope("attach", "--sample-hz", "0", str(SCRIPTS / "loop.py"))
    assert out.returncode == 2 and "sample_hz" in one_error_line(out)


def test_syntax_error_is_the_scripts_own(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\ndef broken(:\n")
    out = memscope("attach", "--headless", "--db", str(tmp_path / "r.db"), str(bad))
    assert out.returncode == 1  # python's status for the script, passed through
    assert "SyntaxError" in out.stderr
    assert "memscope/" not in out.stderr  # no memscope frames in the traceback


def test_existing_run_file_is_refused_without_force(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    db = tmp_path / "r.db"  # a finished run's file: a copy of the session's loop.py run (tests/shared_runs.py)
    shutil.copy(shared_loop(tmp_path_factory)[0], db)
    before = db.read_bytes()
    out = memscope("attach", "--headless", "--db", str(db), str(SCRIPTS / "loop.py"), "--steps", "3")
    assert out.returncode == 2 and "--force" in one_error_line(out)
    assert db.read_bytes() == before  # nothing lost
    again = memscope("attach", "--headless", "--force", "--db", str(db), str(SCRIPTS / "loop.py"),
                     "--steps", "3")
    assert again.returncode == 0


@pytest.mark.parametrize("where", ["/proc/memscope-test.db", "/nonexistent-dir/r.db"])
def test_unwritable_db_location(where: str) -> None:
    out = memscope("attach", "--db", where, str(SCRIPTS / "loop.py"))
    assert out.returncode == 2
    one_error_line(out)


def test_report_on_files_that_are_not_runs(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    for path, words in [(garbage, "not a memscope run"), (other, "not a memscope run"),
                        (empty, "not a memscope run"), (tmp_path / "missing.db", "no such file"),
                        (tmp_path, "directory")]:
        out = memscope("report", str(path))
        assert out.returncode == 2, path
        assert words in one_error_line(out)


def test_truncated_and_newer_run_files(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    # a finished run file (read, never written: the damaged files are copies): the session's
    # 8-step tiny_gpt run at default options (tests/shared_runs.py)
    db, res = shared_attach(tmp_path_factory, [], ["examples/tiny_gpt.py", "--steps", "8"])
    assert res.returncode == 0, res.stderr
    truncated = tmp_path / "truncated.db"
    data = db.read_bytes()
    truncated.write_bytes(data[: len(data) // 3])
    out = memscope("report", str(truncated), "--json")
    assert out.returncode == 2
    one_error_line(out)

    newer = tmp_path / "newer.db"
    shutil.copy(db, newer)
    with sqlite3.connect(newer) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    out = memscope("report", str(newer))
    assert out.returncode == 2 and "newer memscope" in one_error_line(out)


def test_tui_on_bad_file(tmp_path: Path) -> None:
    out = memscope("tui", str(tmp_path / "missing.db"))
    assert out.returncode == 2 and "no such file" in one_error_line(out)
