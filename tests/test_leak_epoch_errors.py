"""Exceptions kept per epoch (tests/scripts/epoch_errors.py, pytorch/examples vae's shape): the check
raises inside a helper on one batch of each epoch and the epoch's function keeps the exception.
Its traceback keeps the helper's frame and, once the epoch's function returns, that frame with its
last batch's locals. A real run at default options: each of those groups is stored at the
``errors.append(e)`` line (the helper's local through the line tracer of a frame that lives
through several armings; the returned frame's locals through the store seen in that frame, or,
when the window began after it, through a longer window cued by the frame kept after returning), and
each local of the returned frame is named through the traceback, also when another group's
search reached that frame first."""

from __future__ import annotations

from pathlib import Path

from conftest import SCRIPTS, memscope, report_json

SCRIPT = SCRIPTS / "epoch_errors.py"
STORE = next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "# STORE" in line)


def test_every_group_kept_by_the_kept_exceptions_is_stored_at_the_append(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    out = memscope("attach", "--headless", "-q", "--db", str(db), str(SCRIPT), "--steps", "200")
    assert out.returncode == 0, out.stderr
    leaks = report_json(db)["leaks"]
    where = f"epoch_errors.py:{STORE}"
    by_holder = {lk["held_by"]: lk for lk in leaks}
    scaled = by_holder["__main__.errors[*].__traceback__.<frame check>.scaled"]
    assert scaled["shape"] == [16, 48] and scaled["site"].endswith(where), scaled
    x = by_holder["__main__.errors[*].__traceback__.<frame train_epoch>.x"]
    assert x["shape"] == [16, 64] and x["site"].endswith(where), x
    # the epoch's last loss: held by the frame the search reached first for `x`'s group
    loss = by_holder["__main__.errors[*].__traceback__.<frame train_epoch>.loss"]
    assert loss["shape"] == [] and loss["site"].endswith(where), loss
    # the model's output: its first capture window began after its epoch's exception was kept, so
    # no store was seen there; the returned frame still referred to is the cue for a longer window,
    # which sees an epoch from its start, and its storing line replaces the creating line
    out_ = by_holder["__main__.errors[*].__traceback__.<frame train_epoch>.out"]
    assert out_["shape"] == [16, 48] and out_["site"].endswith(where), out_
    assert len(leaks) == 4, [lk["held_by"] for lk in leaks]


def test_a_retry_does_not_hold_a_new_suspects_site_back_on_a_short_run(tmp_path: Path) -> None:
    """20 steps: the output's longer second window (its store came before its first one) would
    hold the helper's `scaled`, a suspect found later, past the run's end; new suspects are armed
    first, so every group has a site (the output's is its creating line: the run ends first)."""
    db = tmp_path / "run.db"
    out = memscope("attach", "--headless", "-q", "--db", str(db), str(SCRIPT), "--steps", "20")
    assert out.returncode == 0, out.stderr
    leaks = {lk["held_by"]: lk for lk in report_json(db)["leaks"]}
    assert len(leaks) == 4 and all(lk["site"] for lk in leaks.values()), leaks
    assert leaks["__main__.errors[*].__traceback__.<frame check>.scaled"]["site"].endswith(f"epoch_errors.py:{STORE}")
