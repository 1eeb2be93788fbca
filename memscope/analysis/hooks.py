"""Hooks that keep coming: a module (or parameter) whose hooks grow from inventory to inventory.

Pure reading of the agent's ``hooks`` events (the hook counts per ``module|kind`` at the
inventories where they changed) and ``hook_site`` events (the line that registered them, looked
for once a count kept rising). A count is carried forward over the inventories between two
events (unchanged there). It is a growth by the leak verdict's own rule
(:func:`memscope.analysis.leaks.growth` over the counts: rising at three inventories or more
after warm-up, up to the end, steadily): a hook registered inside the loop. Each such hook runs
at every call from then on: the steps slow down, and what the hooks keep grows faster every step
(a leak that accelerates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memscope.analysis.leaks import growth

if TYPE_CHECKING:
    from memscope.store.reader import RunReader

GLOBAL = "(global)"
KIND_WORDS = {"forward": "forward hook", "forward_pre": "forward pre-hook", "backward": "backward hook",
              "backward_pre": "backward pre-hook", "state_dict": "state_dict hook",
              "state_dict_pre": "state_dict pre-hook", "load_state_dict_pre": "load_state_dict pre-hook",
              "load_state_dict_post": "load_state_dict post-hook", "tensor": "tensor hook (register_hook)",
              "post_accumulate_grad": "post-accumulate-grad hook"}


@dataclass
class HookGrowth:
    module: str  # dotted module name ("" the model, "(global)" global module hooks); a parameter's for tensor hooks
    kind: str  # forward, forward_pre, backward, ..., tensor, post_accumulate_grad
    per_step: float  # hooks gained per step
    first_step: int
    last_step: int
    count: int  # hooks there at the last inventory
    site: str | None  # the line that registered them (file:line), when found

    @property
    def what(self) -> str:
        """``forward hooks on blocks.1``, ``global forward hooks``."""
        words = KIND_WORDS.get(self.kind, self.kind + " hook")
        plural = words.replace(" hook", " hooks", 1)
        if self.module == GLOBAL:
            return f"global {plural}"
        return f"{plural} on {self.module or '(model)'}"

    def how(self) -> str:
        at = f" (at {self.site})" if self.site else ""
        return (f"register the hook once, before the loop, and keep its handle{at} "
                "(`handle = module.register_forward_hook(fn)`; `handle.remove()` when it is no longer "
                "needed): every hook added runs at every call from then on, so each step does more "
                "work than the last, and whatever the hooks keep grows faster every step")

    def as_json(self) -> dict[str, Any]:
        return {"module": self.module, "kind": self.kind, "hooks_per_step": round(self.per_step, 3),
                "first_step": self.first_step, "last_step": self.last_step, "hooks": self.count,
                "site": self.site, "how": self.how()}


def hook_growth(reader: "RunReader", proc: int | None, steps: list[int]) -> list[HookGrowth]:
    """The hook counts that grow steadily to the end of the run (``steps``: the inventory steps
    of process ``proc``), most hooks per step first."""
    if proc is None or not steps:
        return []
    changes: list[tuple[int, dict[str, int]]] = []
    sites: dict[str, str] = {}
    for e in reader.events("hooks"):
        d = e["data"]
        if e["proc"] not in (None, proc) or not isinstance(d, dict) or not isinstance(d.get("counts"), dict):
            continue
        step = d.get("step")
        if isinstance(step, int):
            changes.append((step, {str(k): int(v) for k, v in d["counts"].items() if isinstance(v, int)}))
    for e in reader.events("hook_site"):
        d = e["data"]
        if e["proc"] in (None, proc) and isinstance(d, dict) and isinstance(d.get("key"), str) \
                and isinstance(d.get("site"), str):
            sites.setdefault(d["key"], d["site"])
    if not changes:
        return []
    changes.sort(key=lambda c: c[0])
    keys = {k for _, counts in changes for k in counts}
    out: list[HookGrowth] = []
    for key in sorted(keys):
        points: list[tuple[int, int, int]] = []
        i, now = 0, 0
        for s in steps:
            while i < len(changes) and changes[i][0] <= s:
                now = changes[i][1].get(key, 0)
                i += 1
            points.append((s, now, now))
        g = growth(points)
        if g is None or g.bytes_per_step <= 0:
            continue
        module, _, kind = key.rpartition("|")
        out.append(HookGrowth(module, kind, g.bytes_per_step, g.first_step, g.last_step, points[-1][1],
                              sites.get(key)))
    out.sort(key=lambda h: (-h.per_step, h.module, h.kind))
    return out
