"""Leak detection wired into the agent: tensor inventories at step boundaries and creation-site
capture for suspects, with the rows they write.

At agent start the live-tensor registry starts (one walk over the objects that exist then: few,
under ``attach``, since the agent starts with ``import torch``). At the boundary that closes a
step, in this order: creation-site capture moves on (and writes the site and module of
signatures it resolved), the schedule hears the step's duration and the memory level there, an
inventory runs when one is due (groups, and the holder of suspects), then capture is armed for
signatures that inventory just marked as suspects. A failing part disables itself and leaves an
event; the training goes on.
"""

from __future__ import annotations

import gc
import time
import weakref
from typing import TYPE_CHECKING, Any

from memscope.agent.collectors.inventory import LiveTensors, Schedule, Suspects, forget_kinds, take_inventory
from memscope.agent.collectors.heap import malloc_reading
from memscope.agent.collectors.inventory.holders import clear_frame_snapshots
from memscope.agent.collectors.inventory.hooks import HookWatch, count_hooks, named_modules
from memscope.agent.collectors.leak_sites import SiteCapture

if TYPE_CHECKING:
    from memscope.agent.collectors.host import CollectorHost


class LeakCollector:
    def __init__(self, agent: "CollectorHost", every: int, budget: float) -> None:
        self._agent = agent
        self.live = LiveTensors()
        self.schedule = Schedule(every, budget)
        self.suspects = Suspects()
        self.sites = SiteCapture()
        self._sites_enabled = True
        # boundaries until an arming is surely over: its line tracer read frames' f_locals, and
        # the snapshots it left keep a stale tensor alive (emptied then)
        self._sites_cleanup = 0
        self._gc_said = False
        self.hooks = HookWatch()
        self._root_names: dict[int, tuple[Any, str]] = {}  # id(model) -> (weakref, its name)
        self._hooks_enabled = True

    @property
    def enabled(self) -> bool:
        return self.schedule.every > 0

    def live_tensors(self) -> list[Any] | None:
        """Every live tensor with a Python object, from the registry (strong references: the
        caller clears the list); None when the registry does not run (inventories off)."""
        return self.live.tensors() if self.enabled and self.live.installed else None

    def start(self, fresh: bool = False) -> None:
        """At agent start: the registry of live tensors (skipped when inventories are off);
        ``fresh``: as torch's import ended, before any tensor exists."""
        if not self.enabled:
            return
        try:
            self.live.install(fresh)
        except Exception as exc:
            self._inventory_failed(exc)

    def step_closed(self, step: int, step_s: float, level: int | None = None) -> None:
        """At the boundary that closed ``step`` (which took ``step_s``); ``level``: host RSS, or
        CUDA allocated bytes when CUDA is in use, at this boundary."""
        sites = self.sites
        if self._sites_cleanup or not sites.idle:  # (most boundaries: neither)
            self._sites_boundary(step)
        if self.hooks.armed:
            self._hooks_boundary(step)
        self._inventory_step(step, step_s, level)
        if self.suspects.new_for_sites or not sites.idle:
            self._sites_start()

    def stop(self) -> None:
        for disarm in (lambda: self.sites.disarm(pending=True), self.hooks.disarm, forget_kinds):
            try:
                disarm()
            except Exception:
                pass
        try:
            self.live.remove()
        except Exception:
            pass

    def after_fork(self) -> None:
        for after in (self.sites.after_fork, self.live.after_fork, self.hooks.disarm):
            try:
                after()
            except Exception:
                pass

    # -- inventories ---------------------------------------------------------------------------

    def _inventory_step(self, step: int, step_s: float, level: int | None) -> None:
        """A tensor inventory when one is due."""
        agent = self._agent
        if not (agent.running and self.enabled):
            return
        self.schedule.observe(step_s, level)
        if not self.schedule.due(step):
            return
        self._gc_state()
        try:
            # a tracer's f_locals snapshot on a frame of the loop keeps an old step's batch
            # referenced: it would be counted as a loose tensor of the script's
            clear_frame_snapshots()
            heap = malloc_reading()  # before the scan's own objects: what the training holds
            inv = take_inventory(self.live, agent.optimizers(), self.suspects.to_search,
                                 graph_saved=agent.graph_saved_ids())
            self.suspects.update(step, inv)
        except Exception as exc:
            self._inventory_failed(exc)
            return
        # the budget paces routine inventories by the CPU time they take on this thread (wall
        # time on a busy machine counts the time others ran); a holder search is paid once per
        # suspect, when there is something to report, and is not charged
        self.schedule.taken(step, inv.cpu_s)
        proc = agent.proc_id
        agent.insert("inventories", {
            "proc": proc, "step": step, "tensors": inv.tensors, "bytes": inv.bytes,
            "graph_bytes": inv.graph_bytes, "graph_nodes": inv.graph_nodes,
            "duration_s": inv.duration_s, "truncated": int(inv.truncated), "full": int(inv.full),
            "level": level, "heap": heap and heap[0], "heap_free": heap and heap[1]})
        for (cat, dtype, shape, device, rg, fn), g in inv.groups.items():
            agent.insert("inventory_groups", {
                "proc": proc, "step": step, "category": cat, "dtype": dtype,
                "shape": shape, "device": device, "requires_grad": rg, "grad_fn": fn,
                "count": g.count, "bytes": g.bytes, "graph_bytes": g.graph_bytes,
                "graph_nodes": g.graph_nodes})
        for sig, held_by in inv.holders.items():
            self._holder_row(step, sig, held_by=held_by)
        if self._hooks_enabled:
            c0 = time.thread_time()
            self._hook_counts(step)
            self.schedule.spent_s += max(time.thread_time() - c0, 0.0)  # paid from the same budget

    # -- hooks ---------------------------------------------------------------------------------

    def _hook_counts(self, step: int) -> None:
        """The hooks of the models, written when they changed; the registering line of those
        that keep coming is looked for."""
        agent = self._agent
        try:
            modules = named_modules(agent.models(), self._root_name)
            counts = count_hooks(modules)
            if self.hooks.changed(counts):
                agent.event("hooks", f"{sum(counts.values())} hooks", {"step": step, "counts": counts})
            growing = self.hooks.growing(step, counts)
            if growing:
                why = self.hooks.arm(growing, modules)
                if why:
                    agent.event("hook_site", why, {"step": step, "keys": growing})
            modules.clear()
        except Exception as exc:
            self._hooks_failed(exc)

    def _root_name(self, root: Any) -> str:
        """A model's name as its layer rows name it (``1`` for ``model[1]`` called on its own),
        as naming those rows found it (kept per model)."""
        known = self._root_names.get(id(root))
        if known is not None and known[0]() is root:
            return known[1]
        agent = self._agent
        name = agent.module_name(root)
        if name is None:  # its rows not named yet: its prefix for now, its name next time
            return agent.module_prefix(root)
        try:
            self._root_names[id(root)] = (weakref.ref(root), name)
        except TypeError:
            pass
        return name

    def _hooks_boundary(self, step: int) -> None:
        try:
            for key, line in self.hooks.boundary().items():
                self._agent.event("hook_site", f"{key} registered at {line}",
                                  {"step": step, "key": key, "site": line})
        except Exception as exc:
            self._hooks_failed(exc)

    def _hooks_failed(self, exc: BaseException) -> None:
        self._hooks_enabled = False
        try:
            self.hooks.disarm()
        except Exception:
            pass
        self._agent.event("collector_disabled", f"hooks: {type(exc).__name__}: {exc}")

    def _gc_state(self) -> None:
        """Once: a script that disabled or froze the garbage collector makes every inventory
        walk more objects (the registry is fed by collections), so the time budget spaces them
        further apart; the report says why."""
        if self._gc_said:
            return
        why = None
        if not gc.isenabled():
            why = ("the script disabled the garbage collector (gc.disable()): the registry of live "
                   "tensors is fed by collections, so each inventory lists every object made since")
        elif gc.get_freeze_count():
            why = ("the script froze the garbage collector (gc.freeze()): an inventory that follows a "
                   "collection walks the list of frozen objects to count them")
        if why:
            self._gc_said = True
            self._agent.event("gc_state", why)

    def _inventory_failed(self, exc: BaseException) -> None:
        self.schedule.every = 0
        try:
            self.live.remove()
        except Exception:
            pass
        self._agent.event("collector_disabled", f"inventory: {type(exc).__name__}: {exc}")

    def _holder_row(self, step: int, sig: tuple[Any, ...], held_by: str | None = None,
                    site: str | None = None, module: str | None = None,
                    created_at: str | None = None) -> None:
        cat, dtype, shape, device, rg, fn = sig
        self._agent.insert("leak_holders", {
            "proc": self._agent.proc_id, "step": step, "category": cat, "dtype": dtype,
            "shape": shape, "device": device, "requires_grad": rg, "grad_fn": fn,
            "held_by": held_by, "site": site, "module": module, "created_at": created_at})

    # -- creation sites ------------------------------------------------------------------------

    def _sites_boundary(self, step: int) -> None:
        if self._sites_cleanup:
            self._sites_cleanup -= 1
            if not self._sites_cleanup:
                try:
                    clear_frame_snapshots()
                except Exception:
                    pass
        if not self._sites_enabled:
            return
        try:
            resolved = self.sites.boundary()
        except Exception as exc:
            self._sites_failed(exc)
            return
        for sig, where in resolved.items():
            self._holder_row(step, sig, site=where.stored, module=where.module, created_at=where.created)

    def _sites_start(self) -> None:
        if not (self._sites_enabled and self._agent.running):
            return
        try:
            if self.suspects.new_for_sites:
                self.sites.request(self.suspects.new_for_sites)
                self.suspects.new_for_sites = set()
            was_capturing = self.sites.capturing
            self.sites.start_pending()
            if self.sites.capturing and not was_capturing:
                # the capture steps, store, resolved: then clean up
                self._sites_cleanup = self.sites.window + 2
        except Exception as exc:
            self._sites_failed(exc)

    def _sites_failed(self, exc: BaseException) -> None:
        self._sites_enabled = False
        try:
            self.sites.disarm(pending=True)
        except Exception:
            pass
        self._agent.event("collector_disabled", f"leak sites: {type(exc).__name__}: {exc}")
