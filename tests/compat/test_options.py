"""Every option in the table of ``memscope attach`` options works everywhere the table
says: on attach's command line, and under its Python keyword in ``memscope.start()``,
``memscope.profile()`` and both frameworks' ``MemscopeCallback``. The test reads the table, so
an option added to it without a value here fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from harness import CASES, ROOT, read_rows

GIB = 1 << 30
# flag -> (attach words, Python keyword, Python value, value in the run file's options)
VALUES: dict[str, tuple[list[str], str, Any, Any]] = {
    "--sample-hz": (["--sample-hz", "50"], "sample_hz", 50, 50.0),
    "--nvml-interval": (["--nvml-interval", "0.5"], "nvml_interval", 0.5, 0.5),
    "--no-nvml": (["--no-nvml"], "nvml", False, False),
    "--layers-every": (["--layers-every", "2"], "layers_every", 2, 2),
    "--layers-first": (["--layers-first", "0"], "layers_first", 0, 0),
    "--inventory-every": (["--inventory-every", "1"], "inventory_every", 1, 1),
    "--catch-forward-oom": (["--catch-forward-oom"], "catch_forward_oom", True, True),
    "--inventory-budget": (["--inventory-budget", "0"], "inventory_budget", 0.0, 0.0),
    "--max-steps": (["--max-steps", "5"], "max_steps", 5, 5),
    "--try": (["--try", "mixed_precision"], "try_techniques", ["mixed_precision"], ["mixed_precision"]),
    "--simulate-gpu": (["--simulate-gpu", "1GiB"], "simulate_gpu", "1GiB", GIB),
    "--redact": (["--redact", "dsn"], "redact_patterns", ["dsn"], ["dsn"]),
    "--no-redact": (["--no-redact"], "redact", False, False),
}
# the run file (db, force, its mode); attach's dashboard
SPECIAL = {"--db", "--force", "--group-readable", "--headless"}
# attach --pid's own (tests/test_attach_pid.py): a training started through Python has no PID to attach to
PID_ONLY = {"--pid", "--duration", "--debugger", "--attach-timeout"}


def readme_table() -> dict[str, str]:
    """flag -> the "in Python" column of the attach option table (docs/reference.md)."""
    text = (ROOT / "docs" / "reference.md").read_text()
    start = text.index("| option | meaning | in Python |")
    rows = text[start:].split("\n\n")[0].splitlines()[2:]
    return {row.split("`")[1].split()[0]: row.rstrip(" |").rsplit("|", 1)[1].strip() for row in rows}


def test_the_table_names_a_python_keyword_for_every_option() -> None:
    table = readme_table()
    named = set(VALUES) | SPECIAL | PID_ONLY
    assert set(table) == named, sorted(set(table) ^ named)
    for flag, (_, keyword, _, _) in VALUES.items():
        assert f"`{keyword}=" in table[flag], (flag, table[flag])
    assert "`force=True`" in table["--force"] and "`db`" in table["--db"]
    assert "`group_readable=True`" in table["--group-readable"]
    assert table["--headless"].startswith("—")
    assert all(table[flag] == "—" for flag in PID_ONLY), {f: table[f] for f in PID_ONLY}


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MEMSCOPE_DB", None)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def _check(db: Path, how: str) -> None:
    options = json.loads(read_rows(db, "SELECT options FROM processes")[0][0])
    for flag, (_, keyword, _, stored) in VALUES.items():
        assert options[keyword] == stored, (how, flag, options[keyword])
    # and each did what it says
    steps = [s for (s,) in read_rows(db, "SELECT step FROM steps WHERE status = 'ok' ORDER BY step")]
    assert steps == [0, 1, 2, 3, 4], (how, steps)  # max_steps=5
    kinds = {k for (k,) in read_rows(db, "SELECT kind FROM events")}
    assert "max_steps" in kinds, (how, kinds)
    profiled = {s for (s,) in read_rows(db, "SELECT DISTINCT step FROM layer_stats")}
    assert profiled == {0, 2, 4}, (how, profiled)  # layers_first=0, layers_every=2
    inventoried = {s for (s,) in read_rows(db, "SELECT step FROM inventories")}
    assert inventoried == {0, 1, 2, 3, 4}, (how, inventoried)  # inventory_every=1
    messages = [m for (m,) in read_rows(db, "SELECT message FROM events")]
    assert any(m.startswith("mixed_precision:") for m in messages), (how, messages)
    assert any(m.startswith("simulate_gpu:") for m in messages), (how, messages)  # no CUDA here
    assert read_rows(db, "SELECT COUNT(*) FROM samples")[0][0] > 0


@pytest.mark.slow
def test_every_option_works_in_attach_the_api_and_both_callbacks(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    kwargs = {keyword: value for _, keyword, value, _ in VALUES.values()}
    kwargs["force"] = True
    attach_words = [w for words, _, _, _ in VALUES.values() for w in words]
    runs: dict[str, list[str]] = {
        "attach": [sys.executable, "-m", "memscope", "attach", "--headless", "--force", "--db",
                   str(tmp_path / "attach.db"), *attach_words, str(CASES / "options_attach.py")],
        "start": [sys.executable, str(CASES / "options_api.py"), str(tmp_path / "start.db"),
                  "start", json.dumps(kwargs)],
        "profile": [sys.executable, str(CASES / "options_api.py"), str(tmp_path / "profile.db"),
                    "profile", json.dumps(kwargs)],
        "lightning": [sys.executable, str(CASES / "options_lightning.py"),
                      str(tmp_path / "lightning.db"), json.dumps(kwargs)],
        "huggingface": [sys.executable, str(CASES / "options_hf.py"),
                        str(tmp_path / "huggingface.db"), json.dumps(kwargs)],
    }
    for how in runs:  # an existing file: refused without force
        (tmp_path / f"{how}.db").write_bytes(b"")  # force replaces an empty file
    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(runs, pool.map(lambda c: _run(c, tmp_path), runs.values())))
    for how, out in results.items():
        assert out.returncode == 0, (how, out.stderr[-3000:])  # max_steps: a clean exit
        assert "Traceback" not in out.stderr, (how, out.stderr[-3000:])
        _check(tmp_path / f"{how}.db", how)
