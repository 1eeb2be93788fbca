"""``memscope leaks --diff``: each leak's fix as a unified diff of the line that stored it. The rewrite
rule on lines of each shape, and a real run: the diff, applied with ``patch -p1`` to a copy of the
script, makes the leak go away under ``memscope attach`` (never touching the user's file)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import SCRIPTS, cli, memscope, report_json
from memscope.analysis.leak_patch import patch_line
from memscope.analysis.leaks import Leak
from shared_runs import shared_attach
from test_diff import LEAK_ARGS, LEAK_OPTIONS


def leak(shape: list[int], grad_fn: str | None = "NllLossBackward0", every: float = 1.0) -> Leak:
    return Leak(4, 1.0, shape, "float32", "activations", None, None, None, 2, 9, grad_fn=grad_fn, every=every)


@pytest.mark.parametrize("line,lk,new", [
    ("        history.append(self.loss)  # keep\n", leak([]), "        history.append(self.loss.item())  # keep"),
    ("    cache[it] = logits\n", leak([8, 16]), "    cache[it] = logits.detach()"),
    ("    total_loss += loss\n", leak([], "AddBackward0"), "    total_loss += loss.item()"),
    ("    self.seen[k] = out\n", leak([2, 3]), "    self.seen[k] = out.detach()"),
    ("    kept.append(x.detach())\n", leak([]), "    kept.append(x.item())"),
    ("    out.append(a + b)\n", leak([4]), "    out.append((a + b).detach())"),
    ("    q.insert(0, loss)\n", leak([]), "    q.insert(0, loss.item())"),
])
def test_the_stored_expression_is_rewritten(line: str, lk: Leak, new: str) -> None:
    got, why = patch_line(line, lk)
    assert got == new, why


@pytest.mark.parametrize("line,lk,why", [
    ("    features.append(h.detach())\n", leak([3], None), "no autograd graph"),
    ("    store(\n", leak([]), "several lines"),
    ("    x = 1; y.append(t)\n", leak([]), "several statements"),
    ("    log(loss)\n", leak([]), "not an append"),
    ("    kept.append(t.detach())\n", leak([4]), "already stores"),
])
def test_no_patch_says_why(line: str, lk: Leak, why: str) -> None:
    got, reason = patch_line(line, lk)
    assert got is None and why in reason


def test_an_evaluation_leak_also_says_no_grad() -> None:
    got, why = patch_line("    outs.append(logits)\n", leak([8, 32], "ViewBackward0", every=30))
    assert got == "    outs.append(logits.detach())" and "torch.no_grad()" in why and "every ~30 steps" in why


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_the_diff_applies_and_removes_the_leak(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A loss made inside forward and kept by a callback (minGPT's pattern): the diff patches the
    callback's line; the patched copy runs without a leak; the user's file is untouched."""
    script = SCRIPTS / "leaky_gpt.py"
    before = _digest(script)
    db = tmp_path / "leak.db"
    out = memscope("attach", "--headless", "--db", str(db), str(script), "--leak", "callback", "--steps", "12")
    assert out.returncode == 0, out.stderr
    diff = cli("leaks", str(db), "--diff")
    assert diff.returncode == 0, diff.stderr
    assert "-    kept_losses.append(trainer.loss)\n+    kept_losses.append(trainer.loss.item())\n" in diff.stdout
    assert diff.stdout.count("\n--- a/") == 1 and "--- a/tests/scripts/leaky_gpt.py" in diff.stdout
    copy = tmp_path / "tree"
    (copy / "tests" / "scripts").mkdir(parents=True)
    shutil.copy(script, copy / "tests" / "scripts" / "leaky_gpt.py")
    applied = subprocess.run(["patch", "-p1", "-d", str(copy)], input=diff.stdout, text=True,
                             capture_output=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    fixed = tmp_path / "fixed.db"
    out = memscope("attach", "--headless", "--db", str(fixed), str(copy / "tests" / "scripts" / "leaky_gpt.py"),
                   "--leak", "callback", "--steps", "12")
    assert out.returncode == 0, out.stderr
    assert report_json(db)["leaks"] and report_json(fixed)["leaks"] == []
    assert _digest(script) == before  # read, never written
    # a leak with no graph gets no patch, and says why
    # detached_list, made once per session (tests/shared_runs.py: tests/test_diff.py reads it too)
    plain, out = shared_attach(tmp_path_factory, LEAK_OPTIONS, ["examples/leaks/detached_list.py", *LEAK_ARGS])
    assert out.returncode == 0, out.stderr
    text = cli("leaks", str(plain), "--diff").stdout
    assert "--- a/" not in text and "# no patch: its tensors carry no autograd graph" in text


def test_whatif_fix_leak_reruns_a_patched_copy(tmp_path: Path) -> None:
    """``whatif --try fix_leak``: the leak found, its storing line patched in a copy (the user's
    file untouched), the copy rerun: the leak is gone and what it kept is saved."""
    script = SCRIPTS / "leaky_gpt.py"
    before = _digest(script)
    out = memscope("whatif", "--try", "fix_leak", "--db-dir", str(tmp_path), "--json", str(script),
                   "--leak", "callback")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)["fix_leak"]
    (p,) = doc["patches"]
    assert p["held_by"] == "__main__.kept_losses" and p["patched"] and p["gone"] is True
    assert p["new"] == "    kept_losses.append(trainer.loss.item())"
    assert doc["copy"] == str(tmp_path / "fix_leak" / "leaky_gpt.py") and _digest(script) == before
    # the saving is what the leak kept: its bytes a step over the 11 steps after the first
    saved = doc["kept_before"] - doc["kept_after"]
    assert abs(saved - 11 * p["bytes_per_step"]) <= 0.02 * 11 * p["bytes_per_step"], (saved, p)  # 0.1% measured
    bad = memscope("whatif", "--try", "fix_leak,mixed_precision", str(script))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "on its own" in bad.stderr
