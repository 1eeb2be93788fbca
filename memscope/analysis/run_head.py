"""The cheap, first part of a run's summary, read incrementally: what a dashboard draws first.

:func:`memscope.analysis.summary.summarize` reads everything (leaks, hotspots, the median step,
damage checks) and costs seconds at a million steps. :class:`RunHead` reads only the run row,
the processes, the step counts and the training peak (:func:`~memscope.analysis.summary.find_peak`'s
value and step, from SQL aggregates), the last steps and a downsampled timeline
(:class:`~memscope.analysis.sketch.MaxSketch`). Its first :meth:`RunHead.read` makes one pass over
the steps and samples tables in SQL; each later read takes only rows appended since (``rowid >``
the last seen), so a live run's refresh costs the same at ten thousand steps and at a million.

    head = RunHead()
    with RunReader("run.db") as reader:
        first = head.read(reader)     # first.summary (a RunSummary with the head's fields), ...
        later = head.read(reader)     # later.rows_read: rows this read fetched or aggregated

Fields the head leaves at their defaults (leaks, hotspots, ranks, the median step, the peak's
breakdown and whole-run reading) come from the full summary; see memscope_tui.data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memscope.analysis.oom import post_mortem
from memscope.analysis.sketch import MaxSketch
from memscope.analysis.summary import (OOM_PEAK_TIE, Peak, RunSummary, _device, _main_process,
                                       _oom_step, _peak_cuda, _peak_rss_samples)
from memscope.analysis.timeline import METRIC_LABELS, Series, StepRow, Timeline, recent_steps
from memscope.analysis.views import position
from memscope.store.reader import RunReader
from memscope.store.step_stats import StepStats, scan_source

SKETCH_BUCKETS = 512   # the sketch's buckets (the plot re-buckets them to its width)
CHUNKS = 1024          # a long backlog is read as this many rowid ranges' maxima, not row by row
DIRECT_ROWS = 20_000   # up to this many new rows are read one by one (exact buckets)
_STATUSES = "('ok', 'failed')"  # a step that ran out of memory is a step (find_peak's with_failed)


@dataclass
class _Tally:
    """One process's steps so far."""

    rows: int = 0
    ok: int = 0
    peaks: dict[str, tuple[int, int]] = field(default_factory=dict)  # column -> (value, earliest step)

    def raise_peak(self, column: str, value: int | None, step: int) -> None:
        if value is None:
            return
        have = self.peaks.get(column)
        if have is None or value > have[0] or (value == have[0] and step < have[1]):
            self.peaks[column] = (int(value), int(step))


@dataclass(frozen=True)
class Head:
    summary: RunSummary        # the head's fields only (see the module's docstring)
    timeline: Timeline         # the main process's sketch: bucket maxima, the global maximum exact
    steps: list[StepRow]       # the last steps, most recent first
    position: tuple[int | None, str | None]
    rows_read: int             # rows of samples / steps this read fetched or aggregated


class RunHead:
    """Reads a run's head again and again, each time only what was appended since."""

    def __init__(self, buckets: int = SKETCH_BUCKETS, table_steps: int = 50) -> None:
        self.buckets = buckets
        self.table_steps = table_steps
        self._reset()

    def _reset(self) -> None:
        self._tallies: dict[int, _Tally] = {}
        self._steps_seen = 0          # highest steps rowid tallied
        self._windows_seen: int | None = None  # highest step_windows rowid (folding resets the tally)
        self._folded: dict[int, int] = {}
        self._sketch: MaxSketch | None = None
        self._sketch_proc: int | None = None
        self._seen: dict[str, int] = {}   # series key -> highest rowid sketched
        self._hi: float | None = None     # the main process's last sample time
        self._rss_rows = 0                # its host samples sketched
        self._all_seen = self._all_count = 0  # every process's samples: highest rowid, count
        self._cuda = False

    def read(self, reader: RunReader) -> Head:
        with reader.consistent():  # the counts, maxima and rows of one state of a live file
            return self._read(reader)

    def _read(self, reader: RunReader) -> Head:
        rows_read = 0
        run = reader.run() or {"command": [], "status": "unknown", "exit_code": None,
                               "signal": None, "started": None, "ended": None}
        procs = reader.processes()
        windows = reader.scalar("SELECT max(rowid) FROM step_windows") if reader.version >= 10 else None
        top = int(reader.scalar("SELECT max(rowid) FROM steps") or 0)
        if windows != self._windows_seen or top < self._steps_seen:
            # the writer folded steps into windows (deleting rows this tally counted): start over
            self._tallies, self._steps_seen, self._windows_seen = {}, 0, windows
            self._folded = reader.folded_steps()
        cuda = bool(reader.scalar("SELECT count(*) FROM (SELECT 1 FROM cuda_samples LIMIT 1)"))
        if cuda != self._cuda:  # CUDA came up: the peak is the allocator's column now
            self._tallies, self._steps_seen, self._cuda = {}, 0, cuda
        rows_read += self._tally_steps(reader, top)

        stats = {p: StepStats(p, t.rows, t.ok, None, {}) for p, t in sorted(self._tallies.items())}
        main = _main_process(procs, stats, self._folded)
        main_id = main["id"] if main else None
        oom = post_mortem(reader)
        peak = self._peak(reader, procs, _oom_step(oom, main))
        rows_read += self._sketch_samples(reader, main_id)
        tally = self._tallies.get(main_id) if main_id is not None else None
        summary = RunSummary(
            path=reader.path, command=run["command"], status=run["status"],
            exit_code=run["exit_code"], signal=run["signal"], device=_device(procs),
            torch=main["torch"] if main else None,
            steps=(tally.ok if tally else 0) + (self._folded.get(main_id, 0) if main_id is not None else 0),
            samples=self._count_samples(reader), dropped=sum(p["dropped"] or 0 for p in procs),
            started=run["started"], ended=run["ended"],
            step_mode=main["step_mode"] if main else None, median_step_s=None,
            processes=procs, peak=peak, main_proc=main_id, oom=oom)
        steps = recent_steps(reader, self.table_steps, proc=main_id) if main_id is not None else []
        return Head(summary, self._timeline(run, main_id), steps, position(reader, main_id), rows_read)

    def _count_samples(self, reader: RunReader) -> int:
        """Every process's samples (RunReader.sample_count), counting only rows past the last
        read: count(*) reads the whole table. Samples are never deleted; fewer rows than seen
        means another file: count again."""
        top = int(reader.scalar("SELECT max(rowid) FROM samples") or 0)
        if top < self._all_seen:
            self._all_seen, self._all_count = 0, 0
        if top > self._all_seen:
            if self._all_seen == 0:
                self._all_count = reader.sample_count()
            else:
                self._all_count += int(reader.scalar("SELECT count(*) FROM samples WHERE rowid > ? AND rowid <= ?",
                                                     (self._all_seen, top)) or 0)
            self._all_seen = top
        return self._all_count

    # -- steps: counts and the peak ----------------------------------------------------------

    def _tally_steps(self, reader: RunReader, top: int) -> int:
        if top <= self._steps_seen:
            return 0
        if not self._tallies and top - self._steps_seen > DIRECT_ROWS:
            n = self._aggregate_steps(reader, top)
        else:
            rows = reader.rows("SELECT proc, step, status, peak_rss, peak_allocated FROM steps"
                               " WHERE rowid > ? AND rowid <= ?", (self._steps_seen, top))
            n = 0
            for proc, step, status, rss, alloc in rows:
                n += 1
                t = self._tallies.setdefault(int(proc), _Tally())
                t.rows += 1
                t.ok += status == "ok"
                if status in ("ok", "failed"):
                    t.raise_peak("peak_rss", rss, step)
                    t.raise_peak("peak_allocated", alloc, step)
        self._steps_seen = top
        return n

    def _aggregate_steps(self, reader: RunReader, top: int) -> int:
        """The first read of a long run: counts and the peak column's maximum in SQL, one pass
        per process, and the earliest step at that maximum."""
        src = scan_source(reader, "steps")
        column = "peak_allocated" if self._cuda else "peak_rss"
        n = 0
        for p in reader.processes():
            proc = int(p["id"])
            # the bare column `step` (and rowid) come from the first row in table order to reach the max
            step, rowid, value, rows, not_ok = next(reader.rows(
                f"SELECT step, rowid, max({column}), count(*), count(nullif(status, 'ok'))"
                f" FROM {src} WHERE proc = ? AND rowid <= ?", (proc, top)))
            if not rows:
                continue
            ok_rows = rows
            if not_ok:  # a failed (or other) step: the maximum over ok and failed steps only
                ok_rows, value = next(reader.rows(
                    f"SELECT sum(status = 'ok'), max(CASE WHEN status IN {_STATUSES} THEN {column} END)"
                    f" FROM {src} WHERE proc = ? AND rowid <= ?", (proc, top)))
            t = self._tallies.setdefault(proc, _Tally(int(rows), int(ok_rows or 0)))
            n += int(rows)
            if value is None:
                continue
            # earliest at the maximum (peak_step's answer): that first row, unless a step before it
            # was written after it (then look); the (proc, step) index answers without the table
            if not_ok or reader.scalar("SELECT count(*) FROM steps WHERE proc = ? AND step < ? AND rowid > ?",
                                       (proc, step, rowid)):
                step = reader.scalar(f"SELECT min(step) FROM {src} WHERE {column} = ? AND proc = ?"
                                     f" AND status IN {_STATUSES} AND rowid <= ?", (value, proc, top))
            t.raise_peak(column, int(value), int(step))
        return n

    def _peak(self, reader: RunReader, procs: list[dict[str, Any]],
              oom_step: tuple[int, int] | None) -> Peak:
        """find_peak's value, step and process, from the tallies (the whole-run reading, which
        needs every sample, is left to the full summary)."""
        column = "peak_allocated" if self._cuda else "peak_rss"
        metric = "cuda_allocated" if self._cuda else "rss"
        best: Peak | None = None
        for proc, t in sorted(self._tallies.items()):
            have = t.peaks.get(column)
            if have is not None and (best is None or have[0] > (best.bytes or 0)):
                best = Peak(have[0], have[1], metric, proc)
        if best is None:  # no completed step: the highest reading anywhere (find_peak's too)
            return _peak_cuda(reader) if self._cuda else _peak_rss_samples(reader, procs)
        if oom_step is not None:
            row = reader.query(f"SELECT {column} AS v FROM steps WHERE proc = ? AND step = ?", oom_step)
            failed = row[0]["v"] if row else None
            if failed is not None and failed >= (best.bytes or 0) * (1 - OOM_PEAK_TIE):
                best = Peak(int(failed), oom_step[1], metric, oom_step[0])
        return best

    # -- samples: the timeline ---------------------------------------------------------------

    def _sketch_samples(self, reader: RunReader, proc: int | None) -> int:
        if proc is None:
            return 0
        top = int(reader.scalar("SELECT max(rowid) FROM samples") or 0)
        if proc != self._sketch_proc or top < self._seen.get("rss", 0):  # another process, or rows gone
            self._sketch, self._sketch_proc, self._seen, self._rss_rows = None, proc, {}, 0
        his = [reader.scalar(f"SELECT max(t) FROM {table} WHERE proc = ?", (proc,))
               for table in ("samples", "cuda_samples")]
        self._hi = max((float(h) for h in his if h is not None), default=None)
        n = 0
        devices: list[int] = []
        while self._cuda:  # index seeks, one per device (DISTINCT would read the whole index)
            d = reader.scalar("SELECT min(device) FROM cuda_samples WHERE proc = ? AND device > ?",
                              (proc, devices[-1] if devices else -1))
            if d is None:
                break
            devices.append(int(d))
        sources: list[tuple[str, str, str, tuple[int, ...]]] = [("samples", "rss", "", ())]
        for d in devices:
            sources += [("cuda_samples", "allocated", f"cuda_allocated/{d}", (d,)),
                        ("cuda_samples", "reserved", f"cuda_reserved/{d}", (d,))]
        for table, column, key, extra in sources:
            got = self._fill(reader, proc, table, column, key or column, extra)
            self._rss_rows += got if table == "samples" else 0
            n += got
        return n

    def _fill(self, reader: RunReader, proc: int, table: str, column: str, key: str,
              device: tuple[int, ...]) -> int:
        top = int(reader.scalar(f"SELECT max(rowid) FROM {table}") or 0)
        seen = self._seen.get(key, 0)
        if top <= seen:
            return 0
        where = "+proc = ?" + (" AND +device = ?" if device else "")
        if self._sketch is None:
            lows = [reader.scalar(f"SELECT min(t) FROM {tb} WHERE proc = ?", (proc,))
                    for tb in ("samples", "cuda_samples")]
            lo = min((float(x) for x in lows if x is not None), default=None)
            if lo is None or self._hi is None:
                return 0
            self._sketch = MaxSketch(self.buckets, lo, (self._hi - lo) / self.buckets * 1.0001)
        sketch = self._sketch
        n = 0
        if top - seen <= DIRECT_ROWS:
            for t, v in reader.rows(f"SELECT t, {column} FROM {table} WHERE rowid > ? AND rowid <= ?"
                                    f" AND {where} AND {column} IS NOT NULL", (seen, top, proc, *device)):
                sketch.add(key, float(t), int(v))
                n += 1
        else:  # each rowid range's maximum (a run's rows are written in time order)
            first = int(reader.scalar(f"SELECT min(rowid) FROM {table} WHERE rowid > ?", (seen,)) or seen)
            size = max(1, -(-(top - first + 1) // CHUNKS))
            sql = (f"SELECT t, max({column}) AS v, count({column}) AS n FROM {table}"
                   f" WHERE rowid >= ? AND rowid < ? AND {where}")
            for a in range(first, top + 1, size):
                row = reader.query(sql, (a, min(a + size, top + 1), proc, *device))[0]
                if row["v"] is not None:
                    sketch.add(key, float(row["t"]), int(row["v"]), int(row["n"]))
                    n += int(row["n"])
        self._seen[key] = top
        return n

    def _timeline(self, run: dict[str, Any], proc: int | None) -> Timeline:
        origin: float | None = run["started"]
        sk = self._sketch
        if proc is None or sk is None or origin is None:
            return Timeline(proc, origin, 0.0, 0.0, 0.0, 0)
        series: dict[str, Series] = {}
        for metric in ("cuda_allocated", "cuda_reserved"):
            keys = [k for k in sk.keys() if k.startswith(metric + "/")]
            if keys:
                series[metric] = Series(metric, METRIC_LABELS[metric],
                                        [(t - origin, v) for t, v in sk.summed(keys)])
        series["rss"] = Series("rss", METRIC_LABELS["rss"], [(t - origin, v) for t, v in sk.points("rss")])
        hi = self._hi if self._hi is not None else sk.origin
        return Timeline(proc, origin, sk.origin - origin, hi - origin, sk.width, self._rss_rows, series, [])


