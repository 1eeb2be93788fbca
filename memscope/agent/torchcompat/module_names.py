"""Names of modules as the model the user built names them.

A module's name is its dotted ``named_modules()`` name in its *outermost* container: the module
that holds it (through ``_modules``, any depth) and that no other module holds. That is the
model the user built, also when a framework calls a submodule first (Lightning's
``training_step`` calling ``self.net``: ``net.0``, not ``0``), and when a submodule is called on
its own before the whole model (``model[0](x)``: ``0``).

Wrappers are transparent: ``torch.compile``'s ``OptimizedModule`` (``_orig_mod``), DDP and
``DataParallel`` (``module``), FSDP1 (``_fsdp_wrapped_module``) and ``checkpoint_wrapper``
(``_checkpoint_wrapped_module``) take the name of the module they wrap, so a compiled or DDP
model has the same names as the plain one.

A module does not know its parent. Its container is what torch's registration hooks saw it put
in (memscope.agent.torchcompat.module_parents), or else found by walking up through
``gc.get_referrers``, which scans the heap: callers cache the result per module. With several
parents (``model[2:]`` builds a Sequential sharing children), the one with the most children
wins: the model, not a slice of it.
"""

from __future__ import annotations

import gc
from typing import Any

import torch

from memscope.agent.torchcompat.module_parents import module_parents

# wrapper class name -> the attribute (child name) of the module it wraps
WRAPPERS = {
    "OptimizedModule": "_orig_mod",
    "DistributedDataParallel": "module",
    "DataParallel": "module",
    "FullyShardedDataParallel": "_fsdp_wrapped_module",
    "CheckpointWrapper": "_checkpoint_wrapped_module",
    "OffloadWrapper": "_checkpoint_wrapped_module",
}


def wrapped_child(module: Any) -> str | None:
    """The child name a wrapper module hides (``_orig_mod`` for a compiled module), else None."""
    attr = WRAPPERS.get(type(module).__name__)
    if attr is None:
        return None
    modules = getattr(module, "__dict__", {}).get("_modules") or {}
    return attr if modules.get(attr) is not None else None


def dotted_names(top: Any) -> dict[int, str]:
    """``id(module) -> name`` for every module under ``top`` (``top`` itself is ""); a wrapper's
    wrapped child gets the wrapper's name. The first name reached wins (as named_modules())."""
    names: dict[int, str] = {}
    todo: list[tuple[Any, str]] = [(top, "")]
    while todo:
        module, name = todo.pop(0)
        if id(module) in names:
            continue
        names[id(module)] = name
        hidden = wrapped_child(module)
        try:
            children = list(module._modules.items())
        except Exception:
            continue
        for child_name, child in children:
            if child is None:
                continue
            if child_name == hidden:
                todo.insert(0, (child, name))  # same name, and before its siblings
            else:
                todo.append((child, f"{name}.{child_name}" if name else child_name))
    return names


def outermost(module: Any, max_depth: int = 16) -> tuple[Any, str]:
    """(the outermost module holding ``module``, the dotted path from it to ``module``); for a
    module nothing holds: (``module``, "")."""
    parts: list[str] = []
    m = module
    seen = {id(m)}
    for _ in range(max_depth):
        found = _parent(m)
        if found is None or id(found[0]) in seen:
            break
        seen.add(id(found[0]))
        if found[1] != wrapped_child(found[0]):
            parts.append(found[1])
        m = found[0]
    top = m
    del m
    return top, ".".join(reversed(parts))


def module_path(module: Any) -> str:
    """The dotted name of ``module`` in the outermost model holding it ("" for a model)."""
    return outermost(module)[1]


def _children(module: Any) -> int:
    mods = module.__dict__.get("_modules")
    return len(mods) if mods else 0


def _could_be_modules(d: dict[Any, Any]) -> bool:
    """Whether ``d`` may be a module's ``_modules``: it holds only modules (or None, a
    registered-then-cleared child). A model held in a script's globals (the usual root) is
    then answered with one walk of the heap instead of two (each tens of ms in a big process)."""
    module_type = torch.nn.Module  # type(v), never isinstance: no call into a lazy proxy's __class__
    return all(v is None or issubclass(type(v), module_type) for v in d.values())


def _parent(module: Any) -> tuple[Any, str] | None:
    """(a module whose ``_modules`` holds ``module``, under which name): the one with the most
    children when several do."""
    answered, known = module_parents.parent(module, _children)
    if answered:
        return known
    best: tuple[Any, str] | None = None
    for d in gc.get_referrers(module):
        if type(d) is not dict:
            continue
        keys = [k for k, v in d.items() if v is module and isinstance(k, str)]
        if not keys or not _could_be_modules(d):
            continue  # a module's globals, an instance __dict__: no second walk of the heap
        size = len(d)
        for owner in gc.get_referrers(d):
            if type(owner) is dict and owner.get("_modules") is d:  # an instance __dict__
                owner = next((o for o in gc.get_referrers(owner)
                              if isinstance(o, torch.nn.Module) and o.__dict__ is owner), None)
            if isinstance(owner, torch.nn.Module) and owner.__dict__.get("_modules") is d:
                if best is None or size > _children(best[0]):
                    best = (owner, keys[0])
    return best
