"""Reading a run from Python (scripts, notebooks): ``memscope.load(path) -> Run``.

Each call reads the file as it is then (a run still being written reads further each time);
nothing here imports torch, so a run file copied to a laptop without it opens here too.

    run = memscope.load("nb.db")
    run.report()["peak"]["bytes"]    # the ``memscope report --json`` contract, as a dict
    run.leaks()                      # the leaks list of that contract (with how to fix each)
    run.layers()                     # ``memscope layers --json``: one profiled step's modules
    run.timeline().categories.stack  # the model the dashboard and the HTML page draw
    run                              # in a notebook: the facts and the plots, inline
"""

from __future__ import annotations

import os
import sys
from typing import Any

from memscope.analysis.leaks import fix_how
from memscope.analysis.run_timeline import RunTimeline, run_timeline
from memscope.analysis.summary import RunSummary, summarize
from memscope.report.html import render_fragment
from memscope.report.json_report import layers_from, report_from_summary
from memscope.store.reader import RunReader
from memscope.store.schema import RunFileError
from memscope.units import human_bytes


class LoadError(RunFileError):
    """A file ``memscope.load`` cannot read: one line in IPython (no traceback)."""

    def _render_traceback_(self) -> list[str]:
        return [f"memscope: error: {self}"]


class Run:
    """One run file, read on demand."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._reader().close()  # fail now, in one line, if it is not a run file

    def _reader(self) -> RunReader:
        try:
            return RunReader(self.path)
        except RunFileError as exc:
            raise LoadError(str(exc)) from None

    def summary(self) -> RunSummary:
        with self._reader() as reader:
            return summarize(reader)

    @property
    def name(self) -> str | None:
        """The run's name (``memscope.profile(name=...)``, a framework callback, the notebook)."""
        with self._reader() as reader:
            names = [e["message"] for e in reader.events("run_name") if e["message"]]
        return str(names[0]) if names else None

    def report(self) -> dict[str, Any]:
        """``memscope report --json`` (schema ``memscope.report/1``) as a dict."""
        return report_from_summary(self.summary())

    def leaks(self) -> list[dict[str, Any]]:
        """The leaks, most bytes per step first (the report's ``leaks``, with ``how``: the fix)."""
        return [{**lk.as_json(), "grad_fn": lk.grad_fn, "how": fix_how(lk)} for lk in self.summary().leaks]

    def layers(self, step: int | None = None, depth: int | None = None) -> dict[str, Any]:
        """``memscope layers --json``: the modules of one profiled step (the peak's nearest by
        default), the step and the profiled steps; ``modules`` is empty without a profile."""
        with self._reader() as reader:
            return layers_from(reader, summarize(reader), step, depth)

    def timeline(self, buckets: int = 200) -> RunTimeline:
        """The timeline model: memory over time, by category over the steps, each leak's growth
        and the marks (memscope.analysis.run_timeline)."""
        with self._reader() as reader:
            return run_timeline(reader, summarize(reader), buckets)

    def _repr_html_(self) -> str:
        with self._reader() as reader:
            return render_fragment(reader)

    def __repr__(self) -> str:
        s = self.summary()
        peak = "-" if s.peak.bytes is None else human_bytes(s.peak.bytes)
        return (f"<memscope run {self.path!r}: {s.status}, {s.steps} steps, peak {peak}, "
                f"{len(s.leaks)} leak(s)>")


def load(path: str | os.PathLike[str] | None = None) -> Run:
    """The run at ``path``; without one, the run this process recorded last."""
    if path is None:
        api = sys.modules.get("memscope.agent.runtime.api")  # loaded only by a process that recorded
        last = api.last_recorded() if api is not None else None
        if last is None:
            raise LoadError("load: no run recorded in this process yet; give the run file's path")
        path = last
    return Run(os.fspath(path))
