"""Which groups deserve the costly questions (who holds them, where they are made).

A short history per group (size = bytes + graph bytes + graph nodes x NODE_BYTES) over the last
inventories. A group that grew at each of the last two inventories after warm-up (three rising
points: one fewer than the report's verdict needs, so the answer is there by the time the verdict
is), or reached a new high for the third time since warm-up (growth at evaluations only, far
apart), becomes a suspect: its holder is searched at the next inventory (again at later ones while no
holder was found and it still grows, up to ``SEARCHES`` times) and creation-site capture is asked
for it once.
"""

from __future__ import annotations

from memscope.agent.collectors.inventory.scan import Inventory, Signature
from memscope.constants import NODE_BYTES, WARMUP_STEPS

HISTORY = 8
SEARCHES = 3


class Suspects:
    def __init__(self) -> None:
        self._history: dict[Signature, list[tuple[int, int]]] = {}  # (step, size)
        self._searches: dict[Signature, int] = {}
        self._found: set[Signature] = set()
        self._sited: set[Signature] = set()
        self._high: dict[Signature, tuple[int, int]] = {}  # highest size after warm-up, new highs
        self.to_search: set[Signature] = set()  # at the next inventory
        self.new_for_sites: set[Signature] = set()  # marked by the last update

    def update(self, step: int, inv: Inventory) -> None:
        """After an inventory at ``step`` (which searched ``to_search``)."""
        for sig in self.to_search:
            self._searches[sig] = self._searches.get(sig, 0) + 1
            if inv.holders.get(sig) is not None:
                self._found.add(sig)
        self.to_search = set()
        self.new_for_sites = set()
        for sig in inv.groups:
            self._history.setdefault(sig, [])
        for sig in list(self._history):
            g = inv.groups.get(sig)
            h = self._history[sig]
            h.append((step, g.bytes + g.graph_bytes + g.graph_nodes * NODE_BYTES if g else 0))
            del h[:-HISTORY]
            if len(h) >= 3 and all(p[1] == 0 for p in h[-3:]):
                del self._history[sig]  # gone for good: forget it
                self._high.pop(sig, None)
                continue
            post = [p for p in h[-3:] if p[0] >= WARMUP_STEPS]
            rising = len(post) == 3 and post[0][1] < post[1][1] < post[2][1]
            if step >= WARMUP_STEPS and h[-1][1] > self._high.get(sig, (0, 0))[0]:
                highs = self._high.get(sig, (0, 0))[1] + 1
                self._high[sig] = (h[-1][1], highs)
                # a third new high since warm-up, however far apart: growth at evaluations
                # only (every 30 steps, between flat inventories) rises at no two in a row
                rising = rising or highs >= 3
            if rising:
                if sig not in self._found and self._searches.get(sig, 0) < SEARCHES:
                    self.to_search.add(sig)
                if sig not in self._sited:
                    self._sited.add(sig)
                    self.new_for_sites.add(sig)
        if len(self._history) > 8000:  # churning shapes: keep the largest
            keep = sorted(self._history.items(), key=lambda kv: -kv[1][-1][1])[:2000]
            self._history = dict(keep)
            self._high = {k: v for k, v in self._high.items() if k in self._history}
