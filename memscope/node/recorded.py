"""What a recorded process's own run file says: its step rate and its leak verdict.

A process memscope records (launched by ``memscope attach``, or attached by pid) holds its run
file open; top and the daemon find it there (:func:`memscope.node.target.open_run_files`) and
read it read-only, through the store and the analysis, at most once per ``EVERY_S`` each.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from memscope.analysis.leaks import leak_check, leaks_of
from memscope.store.reader import RunReader
from memscope.units import human_bytes

EVERY_S = 5.0
RATE_STEPS = 50  # the step rate from the last this many steps


@dataclass
class Recorded:
    steps: int  # completed steps recorded so far
    steps_per_s: float | None
    verdict: str  # "leak" | "ok" | "insufficient"
    words: str  # the verdict for a person: "leak +64.0 KiB/step held by __main__.kept"
    held_by: str | None = None
    site: str | None = None
    bytes_per_step: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "steps_per_s": self.steps_per_s, "leak_verdict": self.verdict,
                "held_by": self.held_by, "site": self.site, "bytes_per_step": self.bytes_per_step}


def read_recorded(path: str, pid: int) -> Recorded | None:
    """The step rate and leak verdict of ``pid``'s process row in the run file ``path`` (None when
    the file cannot be read or has no row for it yet)."""
    try:
        with RunReader(path) as reader:
            rows = reader.query("SELECT id FROM processes WHERE pid = ? ORDER BY id DESC LIMIT 1", (pid,))
            if not rows:
                return None
            proc = int(rows[0]["id"])
            last = reader.query("SELECT step, start, end FROM steps WHERE proc = ? AND status = 'ok'"
                                " ORDER BY step DESC LIMIT ?", (proc, RATE_STEPS))
            done = int(reader.scalar("SELECT count(*) FROM steps WHERE proc = ? AND status = 'ok'", (proc,)) or 0)
            done += reader.folded_steps().get(proc, 0)
            rate = None
            if len(last) >= 2 and last[0]["end"] > last[-1]["start"]:
                rate = len(last) / (float(last[0]["end"]) - float(last[-1]["start"]))
            leaks = leaks_of(reader, proc)
            if leaks:
                lk = leaks[0]
                held = f" held by {lk.held_by}" if lk.held_by else ""
                return Recorded(done, rate, "leak", f"leak +{human_bytes(lk.bytes_per_step)}/step{held}",
                                lk.held_by, lk.site, int(lk.bytes_per_step))
            check = leak_check(reader, proc)
            if check.verdict == "ok":
                return Recorded(done, rate, "ok", "no leak")
            return Recorded(done, rate, "insufficient",
                            f"no verdict yet ({check.inventories}/{check.needed} inventories)")
    except Exception:  # noqa: BLE001 - a file being written, damaged, or gone: no reading this time
        return None


class RecordedCache:
    """:func:`read_recorded` at most once per ``every_s`` per (run file, pid)."""

    def __init__(self, every_s: float = EVERY_S) -> None:
        self.every_s = every_s
        self._cache: dict[tuple[str, int], tuple[float, Recorded | None]] = {}

    def get(self, path: str, pid: int, now: float | None = None) -> Recorded | None:
        now = time.monotonic() if now is None else now
        key = (path, pid)
        hit = self._cache.get(key)
        if hit is None or now - hit[0] >= self.every_s:
            hit = (now, read_recorded(path, pid))
            self._cache[key] = hit
        return hit[1]

    def forget_except(self, keys: set[tuple[str, int]]) -> None:
        for key in [k for k in self._cache if k not in keys]:
            del self._cache[key]
