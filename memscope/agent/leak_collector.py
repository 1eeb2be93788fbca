"""Leak detection wired into the agent: tensor inventories at step boundaries and creation-site
capture for suspects, with the rows they write.

At the boundary that closes a step, in this order: creation-site capture moves on (and writes
the site and module of signatures it resolved), an inventory runs when one is due (groups, and
the holder of suspects marked at the previous one), then capture is armed for signatures that
inventory just marked as suspects. A failing part disables itself and leaves an event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memscope.agent.inventory import InventoryCollector
from memscope.agent.leak_sites import SiteCapture

if TYPE_CHECKING:
    from memscope.agent.host import CollectorHost


class LeakCollector:
    def __init__(self, agent: "CollectorHost", every: int, budget: float) -> None:
        self._agent = agent
        self.inventory = InventoryCollector(every, budget)
        self.sites = SiteCapture()
        self._sites_enabled = True

    def step_closed(self, step: int, step_s: float) -> None:
        """At the boundary that closed ``step`` (which took ``step_s``)."""
        self._sites_boundary(step)
        self._inventory_step(step, step_s)
        self._sites_start()

    def stop(self) -> None:
        try:
            self.sites.disarm(pending=True)
        except Exception:
            pass

    def after_fork(self) -> None:
        try:
            self.sites.after_fork()
        except Exception:
            pass

    # -- inventories ---------------------------------------------------------------------------

    def _inventory_step(self, step: int, step_s: float) -> None:
        """A tensor inventory when one is due, and when the next is due given what it cost."""
        agent = self._agent
        if not (agent.running and self.inventory.due(step)):
            return
        try:
            inv = self.inventory.take(step, agent.optimizers())
        except Exception as exc:
            self.inventory.every = 0
            agent.event("collector_disabled", f"inventory: {type(exc).__name__}: {exc}")
            return
        self.inventory.schedule(step, inv.duration_s, step_s)
        proc = agent.proc_id
        agent.insert("inventories", {
            "proc": proc, "step": step, "tensors": inv.tensors, "bytes": inv.bytes,
            "graph_bytes": inv.graph_bytes, "duration_s": inv.duration_s,
            "truncated": int(inv.truncated)})
        for (cat, dtype, shape, device, rg, fn), g in inv.groups.items():
            agent.insert("inventory_groups", {
                "proc": proc, "step": step, "category": cat, "dtype": dtype,
                "shape": shape, "device": device, "requires_grad": rg, "grad_fn": fn,
                "count": g.count, "bytes": g.bytes, "graph_bytes": g.graph_bytes})
        for (cat, dtype, shape, device, rg, fn), held_by in inv.holders.items():
            self._holder_row(step, (cat, dtype, shape, device, rg, fn), held_by=held_by)

    def _holder_row(self, step: int, sig: tuple[Any, ...], held_by: str | None = None,
                    site: str | None = None, module: str | None = None) -> None:
        cat, dtype, shape, device, rg, fn = sig
        self._agent.insert("leak_holders", {
            "proc": self._agent.proc_id, "step": step, "category": cat, "dtype": dtype,
            "shape": shape, "device": device, "requires_grad": rg, "grad_fn": fn,
            "held_by": held_by, "site": site, "module": module})

    # -- creation sites ------------------------------------------------------------------------

    def _sites_boundary(self, step: int) -> None:
        if not self._sites_enabled:
            return
        try:
            resolved = self.sites.boundary()
        except Exception as exc:
            self._sites_failed(exc)
            return
        for sig, (site, module) in resolved.items():
            self._holder_row(step, sig, site=site, module=module)

    def _sites_start(self) -> None:
        if not (self._sites_enabled and self._agent.running):
            return
        try:
            if self.inventory.new_suspects:
                self.sites.request(self.inventory.new_suspects)
                self.inventory.new_suspects = set()
            self.sites.start_pending()
        except Exception as exc:
            self._sites_failed(exc)

    def _sites_failed(self, exc: BaseException) -> None:
        self._sites_enabled = False
        self.stop()
        self._agent.event("collector_disabled", f"leak sites: {type(exc).__name__}: {exc}")
