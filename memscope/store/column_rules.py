"""What every column of a run file may hold: the reading side's one table of damage checks.

Made from the schema itself (:func:`memscope.store.schema.expected_tables`): a column's declared
type, whether it is NOT NULL, and the range its kind of number can have (a count, a time, a
duration, a size in bytes). :class:`memscope.store.reader.RunReader` checks every column a query
reads against its rule, in SQL, before the query's rows reach an analysis, an export or the
dashboard (memscope/store/column_guard.py). A value that breaks its rule is damage (flipped
bits, a foreign writer), never a figure: the reader names it in one line (``damaged run file:
steps.end holds NULL, where a value is required (row 4)``).

SQLite keeps what memscope writes as declared (an INTEGER column turns 3.0 into 3, a TEXT column
turns numbers into text), so a value of another type, or a NULL under NOT NULL, was not written
by memscope. A column added by a later schema without a rule here gets its declared type's
widest range (INTEGER: +-2**62, REAL: +-1e15).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from memscope.store.schema import SCHEMA_VERSION, expected_tables

# Beyond these a value is damage, not a run: counts an analysis loops over (2**40 steps is 35
# years at one step a millisecond), times a calendar can show (year 33658), durations (30
# years), sizes (4 EiB: beyond any machine's memory, and a sum of a million of them still fits
# SQLite's 64-bit integers)
COUNT, TIME, DURATION, BYTES = 2 ** 40, 1e12, 1e9, 2 ** 62

_COUNTS = ("step", "proc", "calls", "count", "tensors", "saved_tensors", "rank", "local_rank",
           "world_size", "version", "id", "pid", "owner_pid", "samples", "dropped",
           "micro_batches", "graph_nodes", "first_step", "last_step", "steps", "peak_rss_step",
           "peak_allocated_step", "end_rss_step", "end_allocated_step", "alloc_retries", "ooms")
_FLAGS = ("truncated", "full", "requires_grad")
_TIMES = ("t", "start", "end", "started", "ended", "heartbeat", "applied", "attached", "process_started")
_DURATIONS = ("forward_s", "backward_s", "duration_s", "duration_min", "duration_max", "duration_sum")
_SIGNED_BYTES = ("alloc_delta", "alloc_peak")  # differences: after minus before
# name -> (low, high); numeric columns not named here are sizes in bytes (0..BYTES)
_RANGES: dict[str, tuple[float, float]] = {
    **dict.fromkeys(_COUNTS, (0, COUNT)),
    **dict.fromkeys(_FLAGS, (0, 1)),
    **dict.fromkeys(_TIMES, (0, TIME)),
    **dict.fromkeys(_DURATIONS, (0, DURATION)),
    **dict.fromkeys(_SIGNED_BYTES, (-BYTES, BYTES)),
    "exit_code": (-2 ** 31, 2 ** 32),  # a wait status' code; Windows' are 32-bit
    "signal": (0, 1024),
    "device": (0, 2 ** 16),  # a CUDA device index (cuda_samples, nvml_samples)
}
# columns written as JSON: a list of sizes (a tensor shape), a list of words (a command line)
_JSON_SIZES = ("shape",)
_JSON_WORDS = ("command", "argv")
_WANT = {"INTEGER": "an integer", "REAL": "a number", "TEXT": "text"}


@dataclass(frozen=True)
class Rule:
    table: str
    column: str
    kind: str  # INTEGER | REAL | TEXT, as declared
    required: bool  # NOT NULL
    low: float | None = None
    high: float | None = None
    json: str | None = None  # "sizes" | "words": the text must be that JSON

    def ok_sql(self) -> str:
        """An SQL condition, true or false (never NULL), that a row's value keeps this rule."""
        c = f'"{self.column}"'
        if self.kind == "TEXT":
            cond = f"typeof({c}) = 'text'"
            if self.json == "sizes":
                cond = (f"CASE WHEN typeof({c}) = 'text' AND length({c}) <= 1000 AND json_valid({c}) "
                        f"THEN json_type({c}) = 'array' AND json_array_length({c}) <= 64 AND NOT EXISTS "
                        f"(SELECT 1 FROM json_each({c}) WHERE type != 'integer' OR value < 0 "
                        f"OR value > {COUNT}) ELSE 0 END")
            elif self.json == "words":
                cond = (f"CASE WHEN typeof({c}) = 'text' AND json_valid({c}) THEN json_type({c}) = 'array' "
                        f"AND NOT EXISTS (SELECT 1 FROM json_each({c}) WHERE type != 'text') ELSE 0 END")
        else:
            types = "'integer'" if self.kind == "INTEGER" else "'integer', 'real'"
            cond = f"typeof({c}) IN ({types})"
            if self.low is not None and self.high is not None:
                cond += f" AND {c} BETWEEN {self.low!r} AND {self.high!r}"
        # typeof(), not IS NULL: SQLite takes ``c IS NULL`` on a NOT NULL column as false unread
        return f"({cond})" if self.required else f"(typeof({c}) = 'null' OR {cond})"

    def problem(self, kind: str, value: Any) -> str | None:
        """Why a value of SQLite type ``kind`` (``typeof``) breaks the rule (``value``: the
        number, the text's start or the blob's length), or None when its type and range keep
        it (a JSON column's text is judged in SQL)."""
        if kind == "null":
            return "holds NULL, where a value is required" if self.required else None
        if kind == "blob":
            return f"holds a blob of {value} bytes, not {_WANT[self.kind]}"
        if kind == "text":
            if self.kind == "TEXT":
                return f"holds text {value!r}, not a JSON list of {self.json}" if self.json else None
            return f"holds text {value!r}, not {_WANT[self.kind]}"
        if self.kind == "TEXT":
            return f"holds {value!r}, not text"
        if kind == "real" and self.kind == "INTEGER":
            return f"holds {value!r}, not an integer"
        if self.low is not None and self.high is not None and not self.low <= value <= self.high:
            return f"holds {value!r}, out of range ({_bound(self.low)} to {_bound(self.high)})"
        return None


def _bound(x: float) -> str:
    for name, b in (("2**62", BYTES), ("2**40", COUNT)):
        if abs(x) == b:
            return f"-{name}" if x < 0 else name
    return f"{x:g}" if isinstance(x, float) else str(x)


def _rule(table: str, column: str, declared: str, required: bool) -> Rule:
    kind = declared if declared in _WANT else "TEXT"
    if kind == "TEXT":
        json = "sizes" if column in _JSON_SIZES else "words" if column in _JSON_WORDS else None
        return Rule(table, column, kind, required, json=json)
    low, high = _RANGES.get(column, (0, BYTES) if kind == "INTEGER" else (-1e15, 1e15))
    return Rule(table, column, kind, required, low, high)


@functools.lru_cache(maxsize=None)
def rules(version: int = SCHEMA_VERSION) -> dict[str, dict[str, Rule]]:
    """{table: {column: Rule}} for every table of schema ``version``."""
    return {table: {c: _rule(table, c, declared, notnull) for c, (declared, notnull) in columns.items()}
            for table, columns in expected_tables(version).items()}


def rule(table: str, column: str) -> Rule | None:
    return rules().get(table, {}).get(column)


def bounds(column: str) -> tuple[float, float] | None:
    """The range of a numeric column (the same for that name in every table)."""
    return _RANGES.get(column)
