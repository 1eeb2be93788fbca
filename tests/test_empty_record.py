"""Say why a record is empty (issue 21): ``python -I`` / ``-E`` (PYTHONPATH ignored, so the
bootstrap never runs), an interpreter without memscope, a script that trains only in a spawned
child. Scripts run under -I/-E/-S are rewritten to start the agent anyway; what cannot be
rewritten is said on stderr and in the run file's ``recording`` lines, with what to do."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SCRIPTS, cli, memscope, report_json
from memscope.runners.isolated import blind_flags, rewrite
from memscope.store.reader import RunReader

pytestmark = pytest.mark.timeout(180)
LOOP = str(SCRIPTS / "loop.py")


@pytest.mark.parametrize("flag", ["-I", "-E"])
def test_a_script_under_an_environment_blind_flag_is_recorded_as_under_plain_python(
        tmp_path: Path, flag: str) -> None:
    db = tmp_path / "r.db"
    seen, plain = tmp_path / "seen.json", tmp_path / "plain.json"
    res = memscope("attach", "--headless", "--db", str(db), "--", sys.executable, flag, LOOP,
                   "--steps", "5", "--dump", str(seen))
    assert res.returncode == 0, res.stderr
    assert "recording empty" not in res.stderr
    subprocess.run([sys.executable, flag, LOOP, "--steps", "1", "--dump", str(plain)], check=True,
                   cwd=ROOT)
    got, want = json.loads(seen.read_text()), json.loads(plain.read_text())
    assert got["argv"][0] == want["argv"][0] == LOOP
    assert got["path0"] == want["path0"] and got["name"] == want["name"] == "__main__"
    data = report_json(db)
    assert data["run"]["steps"] == 5 and data["run"]["recording"] == []


def test_a_command_string_under_E_is_said_to_be_unrecordable(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    code = ("import torch\nm = torch.nn.Linear(2, 2)\no = torch.optim.SGD(m.parameters(), 0.1)\n"
            "for _ in range(8):\n    m(torch.ones(1, 2)).sum().backward(); o.step()\n")
    res = memscope("attach", "--headless", "--db", str(db), "--", sys.executable, "-E", "-c", code)
    assert res.returncode == 0
    assert "memscope: warning: recording empty: python -E ignores PYTHONPATH" in res.stderr
    assert "memscope.start()" in res.stderr
    data = report_json(db)
    assert data["run"]["steps"] == 0
    (line,) = data["run"]["recording"]
    assert line.startswith("empty: python -E ignores PYTHONPATH")
    assert data["leak_check"]["verdict"] == "insufficient"
    text = cli("report", str(db)).stdout
    assert "run at least" not in text and "no training step was recorded" in text


def test_a_script_training_only_in_a_spawned_child_says_so(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    res = memscope("attach", "--headless", "--db", str(db), str(SCRIPTS / "spawn_only.py"))
    assert res.returncode == 0, res.stderr
    assert "trains (its optimizer stepped) but is not recorded" in res.stderr
    assert "memscope.start()" in res.stderr
    data = report_json(db)
    assert data["run"]["steps"] == 0
    assert any("a process started by multiprocessing" in line for line in data["run"]["recording"])
    # the training child is sampled from outside like a worker; its growth is not copy-on-read
    assert data["dataloader_workers"] is None
    assert all(s["technique"] != "fix_leak" for s in data["suggestions"])


def test_memscope_start_in_the_spawned_child_joins_the_run(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    res = memscope("attach", "--headless", "--db", str(db), str(SCRIPTS / "spawn_only.py"), "start")
    assert res.returncode == 0, res.stderr
    with RunReader(db) as reader:
        procs = reader.processes()
        assert len(procs) == 2  # the parent and the child, in the one run file
        assert [len(reader.steps(p["id"])) for p in procs] == [0, 10]
        assert reader.events("agent_missing") == []
    assert "not recorded" not in res.stderr


def test_an_interpreter_without_memscope_is_named(tmp_path: Path) -> None:
    others = [p for p in glob.glob("/root/.pyenv/versions/3.1[0-9]*/bin/python3.1[0-9]")
              if not p.endswith("%d.%d" % sys.version_info[:2])]
    if not others:
        pytest.skip("no other Python version here")
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    db = tmp_path / "r.db"
    res = memscope("attach", "--headless", "--db", str(db), "--", others[0], str(script))
    assert res.returncode == 0, res.stderr
    assert "cannot import memscope" in res.stderr and "install torch-memscope" in res.stderr
    (line,) = report_json(db)["run"]["recording"]
    assert "cannot import memscope" in line


@pytest.mark.parametrize("command, flags, at, special", [
    (["python", "train.py"], "", 1, None),
    (["python3.11", "-I", "train.py", "-E"], "I", 2, None),
    (["/usr/bin/python", "-u", "-W", "ignore", "-IE", "-m", "pkg.train"], "IE", 5, None),
    (["python", "-Wignore", "-S", "--", "train.py"], "S", 4, None),
    (["python", "-E", "-c", "pass"], "E", 2, "-c"),
    (["python", "-Im", "pkg"], "I", None, "-m"),
    (["torchrun", "-I", "train.py"], "", None, None),
])
def test_blind_flags(command: list[str], flags: str, at: int | None, special: str | None) -> None:
    assert blind_flags(command) == (flags, at, special)


def test_rewrite_puts_the_runner_before_the_script() -> None:
    new, note = rewrite(["python", "-I", "train.py", "--lr", "1"], "/boot")
    assert new == ["python", "-I", "/boot/_memscope_isolated_main.py", "train.py", "--lr", "1"]
    assert note is None
    assert rewrite(["python", "train.py"], "/boot") == (["python", "train.py"], None)
    same, note = rewrite(["python", "-E", "-c", "pass"], "/boot")
    assert same == ["python", "-E", "-c", "pass"] and note is not None and "-c" in note
