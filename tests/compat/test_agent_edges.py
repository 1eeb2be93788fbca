"""Edges of the agent's contract with the training: a stop from another thread, and a leak found
under torch.compile without touching its graphs. (Names when a submodule is called first:
test_eager.py, in its shared run.)"""

from __future__ import annotations

from pathlib import Path

from harness import equal_tensors, normalise, report, run_arm


def test_stop_from_the_main_thread_leaves_nothing_on_the_training_thread(tmp_path: Path) -> None:
    arm = run_arm("plain", tmp_path, "stop_from_main.py", [])
    assert arm.returncode == 0, arm.stderr[-3000:]
    facts = arm.out["facts"]
    # armed on the worker when the main thread stopped memscope: its mode and tracer were there
    assert facts["phase"] in ("capture", "capture2") and facts["stack"] == 1, facts
    # and the worker removed both itself, at its next Python call
    assert facts["stack_after"] == 0 and not facts["traced_after"], facts
    assert arm.training_stderr.strip() == "compat: end of script", arm.stderr


def test_a_leak_under_compile_is_found_without_recompiling(tmp_path: Path) -> None:
    plain = run_arm("plain", tmp_path, "compiled_leak.py", [])
    inv = run_arm("invasive", tmp_path, "compiled_leak.py", [])
    assert plain.returncode == inv.returncode == 0, inv.stderr[-3000:]
    assert not equal_tensors(plain.out, inv.out)  # same losses, parameters and graph counts
    assert plain.out["dynamo"]["unique_graphs"] == 1
    assert normalise(inv.training_stderr, tmp_path) == normalise(plain.stderr, tmp_path)
    leaks = report(inv.db)["leaks"]
    assert leaks and leaks[0]["held_by"] == "__main__.kept", leaks
    # creation-site capture would push a function mode (a recompile): not armed under compile
    assert leaks[0]["site"] is None
