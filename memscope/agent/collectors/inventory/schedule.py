"""When the next tensor inventory is due.

Exact (``inventory_budget == 0``, what ``--inventory-every N`` alone asks for): the first step
seen, then every N steps.

Automatic (the default: a budget > 0). Defaults are the product: a leak of a short run must be
seen within a dozen steps, and a long run must not pay for inventories it does not need.

* Dense first: an inventory every ``every`` steps (default 1) through step ``DENSE_STEPS``.
* Then thinning out: every ``max(every, step // DENSITY)`` steps, so the number of inventories
  grows with the logarithm of the run's length and the last ``DENSITY`` of them always span
  about the last half of the run (a verdict at any step has recent, evenly spread evidence).
* Within a time budget: a due inventory runs only while inventories so far took at most
  ``budget`` of the training time plus ``ALLOWANCE_S`` (the first steps are paid from the
  allowance: with inventories of a millisecond or two, short runs get them all). Inventories are
  charged the CPU time they take on the training thread (on a busy machine wall time also counts
  the time other processes ran), training time is wall time.
* Pulled forward by a free signal: the memory level at each step boundary (host RSS on CPU,
  CUDA allocated bytes), already read there. When it rose at ``SIGNAL_RISES`` boundaries in a
  row, by ``SIGNAL_MIN_BYTES`` or more since the last inventory, one is due now (within
  ``SIGNAL_SHARE`` of the training time), so growth that starts late is looked at soon.
"""

from __future__ import annotations

DENSE_STEPS = 16
DENSITY = 16
ALLOWANCE_S = 0.25
SIGNAL_RISES = 3
SIGNAL_MIN_BYTES = 64 << 10
SIGNAL_SHARE = 0.02


class Schedule:
    def __init__(self, every: int, budget: float) -> None:
        self.every = every  # 0: never
        self.budget = budget  # 0: exactly every ``every`` steps
        self.spent_s = 0.0  # inventories so far
        self.elapsed_s = 0.0  # training time so far (step durations)
        self.last: int | None = None  # the last inventoried step
        self._level: int | None = None  # memory level at the last boundary
        self._level_at_last: int | None = None  # ... and at the last inventory
        self._rises = 0
        self.pulled = 0  # inventories the signal pulled forward

    def observe(self, step_s: float, level: int | None) -> None:
        """At a step boundary, before ``due``: the closed step's duration and the memory level."""
        self.elapsed_s += max(step_s, 0.0)
        if level is None:
            return
        if self._level is not None and level > self._level:
            self._rises += 1
        else:
            self._rises = 0
        self._level = level
        if self._level_at_last is None:
            self._level_at_last = level

    def interval(self, step: int) -> int:
        if self.budget <= 0 or step < DENSE_STEPS:
            return self.every
        return max(self.every, step // DENSITY)

    def due(self, step: int) -> bool:
        if self.every <= 0:
            return False
        scheduled = self.last is None or step - self.last >= self.interval(step)
        if self.budget <= 0:
            return scheduled
        if scheduled and self.spent_s <= self.budget * self.elapsed_s + ALLOWANCE_S:
            return True
        if self._signal() and self.spent_s <= SIGNAL_SHARE * self.elapsed_s + ALLOWANCE_S:
            self.pulled += 1
            return True
        return False

    def _signal(self) -> bool:
        if self._rises < SIGNAL_RISES or self._level is None or self._level_at_last is None:
            return False
        return self._level - self._level_at_last >= SIGNAL_MIN_BYTES

    def taken(self, step: int, cost_s: float) -> None:
        """An inventory ran at ``step`` and took ``cost_s``."""
        self.last = step
        self.spent_s += max(cost_s, 0.0)
        self._level_at_last = self._level
        self._rises = 0
