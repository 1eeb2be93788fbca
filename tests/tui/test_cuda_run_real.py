"""The dashboard on a run file recorded on a real GPU (tests/data/cuda_run_nanogpt_real.db: an
H100, torch 2.11; tests/test_cuda_runs_real.py says what it holds): CUDA's figures, not host RSS."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from memscope.analysis.timeline import memory_timeline
from memscope.store.reader import RunReader
from memscope.units import human_bytes
from memscope_tui.app import MemscopeApp

REAL = Path(__file__).resolve().parents[1] / "data" / "cuda_run_nanogpt_real.db"


async def wait_until(pilot: Pilot[Any], predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the dashboard did not get there in time"
        await pilot.pause(0.02)


async def test_a_real_cuda_run_shows_cuda_allocated(tmp_path: Path) -> None:
    db = Path(shutil.copy(REAL, tmp_path / "cuda.db"))
    with RunReader(db) as reader:
        series = memory_timeline(reader).series
        steps = reader.steps()
    assert "cuda_allocated" in series
    app = MemscopeApp(str(db))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.loads >= 1)
        await pilot.pause()
        peak = str(app.query_one("#peak", Static).render())
        device = str(app.query_one("#device", Static).render())
        caption = str(app.query_one("#caption", Static).render())
        table = app.query_one("#steps", DataTable)
        labels = [str(c.label) for c in table.columns.values()]
        newest = [str(cell) for cell in table.get_row_at(0)]
    assert peak.startswith("peak 359.43 MiB CUDA allocated")  # the plain run's max_memory_allocated
    assert device.startswith("cuda:0 · torch 2.11.0+cu130")
    assert caption.startswith("CUDA allocated")
    assert f"high {human_bytes(series['cuda_allocated'].max)}" in caption
    assert labels == ["step", "duration", "peak RSS", "peak alloc", "peak reserved", "status"]
    last = steps[-1]
    assert newest[0] == "29" and newest[3] == human_bytes(last["peak_allocated"])
    assert newest[4] == human_bytes(last["peak_reserved"])
