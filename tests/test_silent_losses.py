"""What the recorder could not record is counted and said, never dropped silently: an OOM whose
record failed, a framework callback's step mark that failed (the DataLoader workers' sampler:
tests/test_worker_sampler.py). Each is a ``recording_degraded`` event, which ``memscope report``
lists under what makes the record incomplete."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import torch

from conftest import memscope as run_cli
from memscope.agent.runtime import api
from memscope.integrations.session import Session


def degraded(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT message FROM events WHERE kind = 'recording_degraded'")]


def test_an_oom_whose_record_fails_is_said(tmp_path: Path) -> None:
    db = tmp_path / "oom.db"
    agent = api.start(str(db), layers_every=0)
    try:
        recorder = agent._oom

        def broken(*args: Any, **kw: Any) -> None:
            raise KeyError("planted")  # injected: the record path itself failing
        recorder._record = broken  # type: ignore[method-assign]
        try:
            torch.empty(2 ** 50)  # a real allocator failure
        except RuntimeError as exc:
            recorder.record(exc)
        assert recorder.failed == 1
    finally:
        api.stop()
    (message,) = degraded(db)
    assert "an out-of-memory error (RuntimeError: " in message
    assert "could not be recorded (KeyError: 'planted')" in message
    text = run_cli("report", str(db)).stdout
    assert "could not be recorded" in text


def test_a_step_mark_that_fails_is_counted_and_said(tmp_path: Path) -> None:
    db = tmp_path / "cb.db"
    session = Session("Lightning", str(db), None, {"layers_every": 0})
    session.begin(0)
    session.step(1)
    session.step("not a step")  # type: ignore[arg-type]  # what a broken counter hands over
    session.step(object())  # type: ignore[arg-type]
    session.step(2)
    assert session.missed == 2
    session.end()
    first, total = degraded(db)
    assert "the Lightning callback could not mark a step (ValueError: " in first
    assert "the Lightning callback could not mark 2 steps" in total
