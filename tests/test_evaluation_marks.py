"""Evaluations marked on the timeline: a real training that evaluates three times (model.eval(),
batches under no_grad for about half a second, model.train()) under attach at default options.
The run file holds one ``evaluation`` event per evaluation, placed inside the span the script
itself measured and ending after it; the timeline model makes them marks with a span, and the
HTML page draws them. Steps that run in eval mode (a script that trains with frozen batch norm)
are training, not evaluations."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from conftest import SCRIPTS, memscope
from memscope.analysis.run_timeline import run_timeline
from memscope.analysis.summary import summarize
from memscope.report.html import render_html
from memscope.store.reader import RunReader

LATE_S = 1.0  # how long after an evaluation's end the sampler may see it (a loaded 2-core machine)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[float, float, int]]]:
    db = tmp_path_factory.mktemp("evals") / "run.db"
    out = memscope("attach", "--headless", "--db", str(db), str(SCRIPTS / "evaluating.py"), "--steps", "30")
    assert out.returncode == 0, out.stderr
    spans = [(float(a), float(b), int(s)) for _, a, b, s in
             (line.split() for line in out.stdout.splitlines() if line.startswith("EVAL "))]
    assert len(spans) == 3
    return db, spans


def test_each_evaluation_is_one_event_spanning_it(run: tuple[Path, list[tuple[float, float, int]]]) -> None:
    db, spans = run
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT t, step, message, data FROM events WHERE kind = 'evaluation' ORDER BY t").fetchall()
    assert len(rows) == len(spans), rows
    for (t, step, message, data), (start, end, last_step) in zip(rows, spans):
        seen_end = json.loads(data)["end"]
        assert start <= t <= end, (t, start, end)  # seen while the model was in eval mode
        assert end <= seen_end <= end + LATE_S, (seen_end, end)
        assert step == last_step + 1  # the step the tracker had begun: the one after the evaluation
        assert message.startswith("evaluation: Sequential in eval mode for ") and f"(from step {step})" in message


def test_the_timeline_and_the_page_mark_them(run: tuple[Path, list[tuple[float, float, int]]]) -> None:
    db, spans = run
    with RunReader(db) as reader:
        summary = summarize(reader)
        marks = [m for m in run_timeline(reader, summary).marks if m.kind == "evaluation"]
        page = render_html(reader, summary)
    assert len(marks) == len(spans)
    for m in marks:
        assert m.end is not None and 0.3 < m.end - m.t < 0.5 + LATE_S, (m.t, m.end)
    assert page.count('<rect class="mark evaluation"') == len(spans)
    assert "evaluation: Sequential in eval mode" in page


def test_steps_in_eval_mode_are_training_not_evaluations(tmp_path: Path) -> None:
    """The same script training in eval mode throughout: its evaluations after steps 9 and 19
    are followed by steps in eval mode (nothing tells them from training), so only the last,
    after the last step, is one."""
    db = tmp_path / "frozen.db"
    out = memscope("attach", "--headless", "--db", str(db), str(SCRIPTS / "evaluating.py"), "--steps", "30",
                   "--eval-s", "0.3", "--train-in-eval")
    assert out.returncode == 0, out.stderr
    with sqlite3.connect(db) as conn:
        starts = [t for (t,) in conn.execute("SELECT t FROM events WHERE kind = 'evaluation'")]
        (last_end,) = conn.execute("SELECT max(end) FROM steps").fetchone()
    assert len(starts) == 1 and starts[0] >= last_end, (starts, last_end)
