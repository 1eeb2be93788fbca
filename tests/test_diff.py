"""``memscope diff A.db B.db``: real runs compared, "did checkpointing help" answered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli, memscope
from doc_samples import DIFF_GPT
from shared_runs import shared_attach

# the leak runs: an inventory every 2 steps, 14 steps (tests/test_leaks.py, tests/test_leak_patch.py)
LEAK_OPTIONS, LEAK_ARGS = ["--inventory-every", "2"], ["--steps", "14"]
GPT = ["--steps", "4", "--eval-every", "0", "--batch", "8", "--seq", "96", "--layers", "2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """tiny_gpt without (A) and with (B) activation checkpointing, same seed and sizes: the pair
    docs/plan.md's diff sample shows (tests/doc_samples.py), made once per session and read only
    (tests/shared_runs.py)."""
    out = []
    for extra in ([], ["--checkpoint"]):
        db, res = shared_attach(tmp_path_factory, [], [*DIFF_GPT, *extra])
        assert res.returncode == 0, res.stderr
        out.append(db)
    return out[0], out[1]


def diff_json(a: Path, b: Path) -> dict:  # type: ignore[type-arg]
    res = cli("diff", str(a), str(b), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_checkpointing_saving_shows(runs: tuple[Path, Path]) -> None:
    a, b = runs
    d = diff_json(a, b)
    assert d["schema"] == "memscope.diff/1" and d["metric"]["same"]
    act = d["breakdown"]["activations"]
    # checkpointing keeps only each block's input: most saved activations are gone
    assert act["b"] < act["a"] / 3 and act["delta"] == act["b"] - act["a"] < 0
    assert d["activations"]["delta"] < 0
    layers = {x["module"]: x for x in d["layers"]}
    for block in ("blocks.0.attn", "blocks.1.attn", "blocks.2.attn", "blocks.3.attn"):
        assert layers[block]["a"] > 0 and layers[block]["b"] == 0
    # parameters, gradients and optimizer state do not change with checkpointing
    for k in ("parameters", "gradients", "optimizer_state"):
        assert d["breakdown"][k]["delta"] == 0, k
    assert d["steps"]["a"] == d["steps"]["b"] == 8
    assert d["median_step_s"]["a"] > 0 and d["median_step_s"]["b"] > 0
    assert d["leaks"]["groups"] == []
    text = cli("diff", str(a), str(b))
    assert text.returncode == 0, text.stderr
    row = next(ln for ln in text.stdout.splitlines() if ln.strip().startswith("activations (layers)"))
    assert "-" in row.split("MiB")[2]  # B - A is negative
    assert "blocks.0.attn" in text.stdout


def test_a_run_against_itself_has_no_delta(runs: tuple[Path, Path]) -> None:
    d = diff_json(runs[0], runs[0])
    assert d["peak"]["delta"] == 0 and d["peak"]["ratio"] == 1.0
    assert all(v["delta"] == 0 for v in d["breakdown"].values())
    assert all(x["delta"] == 0 for x in d["layers"])
    assert d["median_step_s"]["delta"] == 0


def test_leak_fixed_in_b(tmp_path_factory: pytest.TempPathFactory) -> None:
    dbs = []
    for name in ("detached_list", "healthy"):
        # made once per session (tests/shared_runs.py): the leak tests read detached_list's too
        db, res = shared_attach(tmp_path_factory, LEAK_OPTIONS, [f"examples/leaks/{name}.py", *LEAK_ARGS])
        assert res.returncode == 0, res.stderr
        dbs.append(db)
    d = diff_json(dbs[0], dbs[1])
    assert d["leaks"]["bytes_per_step"]["a"] == 32 * 256 * 4 and d["leaks"]["bytes_per_step"]["b"] == 0
    group = d["leaks"]["groups"][0]
    assert group["shape"] == [32, 256] and group["a"] == 32 * 256 * 4 and group["b"] is None
    assert "fixed in B" in cli("diff", str(dbs[0]), str(dbs[1])).stdout


def test_bad_input_one_line(runs: tuple[Path, Path], tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all" * 100)
    for args in ([str(runs[0]), str(junk)], [str(tmp_path / "nope.db"), str(runs[0])], [str(runs[0])]):
        res = memscope("diff", *args)  # a real process: its one line and exit status
        assert res.returncode == 2
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def test_a_side_without_profiling_says_so(runs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    # made once per session: tests/test_layers.py's default-cadence test reads it too
    db, res = shared_attach(tmp_path_factory, ["--layers-every", "0"], ["examples/tiny_gpt.py", *GPT])
    assert res.returncode == 0, res.stderr
    d = diff_json(runs[0], db)
    assert d["activations"]["a"] > 0 and d["activations"]["b"] is None
    assert d["layers"] and all(x["b"] is None and x["delta"] is None for x in d["layers"])
    assert "B has no profiled step" in cli("diff", str(runs[0]), str(db)).stdout
