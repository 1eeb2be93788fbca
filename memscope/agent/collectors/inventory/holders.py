"""Who holds a suspect group's tensors: a name a person can read and go fix.

``find_holders`` takes a few sample objects per group and answers, per group, the root that keeps
one of them alive, searching all groups at once, level by level up ``gc.get_referrers`` (each
level is one pass over the process's objects, so the levels are shared, and bounded):

* named roots: a module global (``__main__.features``, also of imported modules), a class
  attribute (``__main__.Cache.store``), a function's default, keyword default, closure cell or
  attribute (``__main__.log.__defaults__[0]``, ``__main__.log.__kwdefaults__['cache']``,
  ``__main__.make_probe.<locals>.probe.<closure seen>``);
* walked through on the way: lists, tuples, deques, sets, dicts (by key), instances (their
  ``__dict__`` and ``__slots__``; nn.Module children by name), bound methods (``.__self__``),
  ``functools.partial`` (``.args[0]``, ``.keywords['k']``), closure cells;
* walked through too: an exception's ``__traceback__`` (its frames' local variables:
  ``__main__.errors[*].__traceback__.<frame check>.scaled``), ``__context__``, ``__cause__`` and
  ``args``; a suspended generator's or coroutine's frame (``.<generator windows>.kept``); a
  ``functools.lru_cache`` (``__main__.table<lru_cache maxsize=None, 58 entries>``);
* when no named root is found: a local variable of the training thread's frames, preferring the
  container that grows (``losses``) over a variable that is one of its elements (``loss``), then
  of other threads' frames (``__main__.drain.<locals>.kept (in thread 'logger')``).

The growing container itself is named without an index (``__main__.history``, not
``__main__.history[12]``); containers on the way keep theirs (``__main__.trainer.callbacks[1].store``),
but a container of exceptions, frames or generators, one kept per step, is the growing one:
``[*]`` (each of its entries).
"""

from __future__ import annotations

import functools
import gc
import sys
import threading
import types
from collections import deque
from itertools import compress
from typing import Any, Hashable

MAX_DEPTH = 10  # levels of referrers walked up (an instance's __dict__ is a level of its own)
MAX_REFERRERS = 600  # referrers examined per group
_LIBRARY = ("torch", "lightning", "pytorch_lightning", "transformers", "accelerate")

# A path is a tuple of parts, from the holder down to the sample:
#   ("key", k)    an entry of a dict on the way: ['k'] (or .k when the dict is an instance's __dict__)
#   ("item", k)   the entry holding a sample: nothing (the container is the holder), .k in a __dict__
#   ("index", i)  an element of a sequence on the way: [i]
#   ("attr", a)   .a
#   ("each", None) an entry of a container of per-step holders (exceptions, frames): [*]
#   ("frame", q)  the frame of function q that a traceback keeps: .<frame q>
#   ("gen", q)    the frame of a suspended generator or coroutine q: .<generator q>
#   ("local", n)  a local variable of a frame on the way: .n
#   ("cache", (maxsize, n)) the entries of a functools.lru_cache: <lru_cache maxsize=M, n entries>
Part = tuple[str, Any]
Path = tuple[Part, ...]


def render(parts: Path) -> str:
    out = []
    for kind, v in parts:
        if kind == "attr":
            out.append(f".{v}")
        elif kind == "key":
            out.append(f"[{_key_text(v)}]")
        elif kind == "index":
            out.append(f"[{v}]")
        elif kind == "each":
            out.append("[*]")
        elif kind == "local":
            out.append(f".{v}")
        elif kind in ("frame", "gen"):
            out.append(f".<{'frame' if kind == 'frame' else 'generator'} {v}>")
        elif kind == "cache":
            maxsize, n = v
            out.append(f"<lru_cache maxsize={maxsize}, {n} entries>")
    return "".join(out)


def _key_text(k: Any) -> str:
    """A dict key as code would write it; a tensor key (``opt.state[param]``) as its type,
    dtype and shape: its repr is the whole tensor, printed over many lines."""
    if k is None or isinstance(k, (str, int, float, bool)):
        return repr(k)
    shape = getattr(k, "shape", None)
    if shape is not None and hasattr(k, "dtype"):
        return f"<{type(k).__name__} {str(k.dtype).removeprefix('torch.')} {list(shape)}>"
    text = repr(k)
    return text if len(text) <= 60 and "\n" not in text else f"<{type(k).__name__}>"


def _as_attrs(parts: Path) -> Path:
    """The first part is an attribute of an instance (it came up through its ``__dict__``);
    nn.Module's ``._modules`` / ``._parameters`` / ``._buffers`` followed by a key become that key
    as an attribute (``.fc2``)."""
    if not parts or parts[0][0] not in ("key", "item") or not isinstance(parts[0][1], str):
        return parts
    first = ("attr", parts[0][1])
    rest = parts[1:]
    if first[1] in ("_modules", "_parameters", "_buffers") and rest and rest[0][0] in ("key", "item") \
            and isinstance(rest[0][1], str):
        return (("attr", rest[0][1]),) + rest[1:]
    return (first,) + rest


def _as_key(parts: Path) -> Path:
    """A dict entry that must show its key even when it holds the sample (keyword defaults)."""
    if parts and parts[0][0] == "item" and parts[0][1] is not None:
        return (("key", parts[0][1]),) + parts[1:]
    return parts


def _module_dicts() -> dict[int, str]:
    out: dict[int, str] = {}
    for name, mod in list(sys.modules.items()):
        d = getattr(mod, "__dict__", None) if isinstance(mod, types.ModuleType) else None
        if type(d) is dict and (id(d) not in out or name == "__main__"):
            out[id(d)] = name  # __main__ wins over its aliases (__mp_main__)
    return out


def _preference(name: str) -> tuple[int, str]:
    """Among names found at one level: the script's own first, libraries' last."""
    if name.startswith("__main__."):
        return (0, name)
    if name.startswith(_LIBRARY):
        return (2, name)
    return (1, name)


class _Search:
    def __init__(self, samples: dict[Hashable, list[Any]]) -> None:
        self.modules = _module_dicts()
        self.objs: dict[int, Any] = {}  # id -> object on some path (held here only)
        self.path: dict[int, tuple[Path, Hashable]] = {}  # id -> (path down to a sample, group)
        self.own: set[int] = {id(self.objs), id(self.path), id(self.modules), id(samples)}
        self.named: dict[Hashable, str] = {}  # the script's root holding a container of the group: done
        self.others: dict[Hashable, tuple[tuple[int, int, int], str]] = {}  # the best other root so far
        self.budget = {key: MAX_REFERRERS for key in samples}
        # frames on some thread's stack: their locals are read by _from_frames, not walked up
        # from (ids only: a list of them would hold this very frame, and with it the samples,
        # in a cycle that a script with the collector off never frees)
        self.running_ids = _running_frames()
        self.own.add(id(self.running_ids))
        self.frontier: list[Any] = []
        # objects on a path from one of the older half of a group's samples (the oldest alive: a
        # leak's), and the root the newer ones reached first, kept while the older are searched
        # on (a group of the loop's current batch and of the batches a queue keeps: the loop's
        # `data` names the newest, the queue the leak)
        self.old: set[int] = set()
        self.young: dict[Hashable, list[str]] = {}
        # a group reaching an object already on another group's path (two locals of one frame a
        # traceback keeps: the epoch's last `x` and `loss`): (id, its path down from there) per
        # group, named from the other group's name when that one goes through it
        self.shared: dict[Hashable, list[tuple[int, Path]]] = {}
        for key, lst in samples.items():
            self.own.add(id(lst))
            for i, o in enumerate(lst):
                if id(o) not in self.objs:
                    self.objs[id(o)] = o
                    self.path[id(o)] = ((), key)
                    self.frontier.append(o)
                    if i < (len(lst) + 1) // 2:
                        self.old.add(id(o))

    def run(self) -> None:
        try:
            self._levels()
        finally:
            for key, names in self.young.items():  # the older samples never reached a root
                if key not in self.named:
                    self.named[key] = min(names, key=_preference)

    def _levels(self) -> None:
        for _ in range(MAX_DEPTH):
            if not self.frontier:
                return
            args = tuple(self.frontier)
            self.own.update((id(args), id(self.frontier)))
            referrers = gc.get_referrers(*args)
            self.own.add(id(referrers))
            fids = {id(o) for o in args}
            found: dict[Hashable, list[str]] = {}
            nxt: list[Any] = []
            for r in referrers:
                rid = id(r)
                if rid in self.own or rid in self.running_ids:
                    continue
                if rid in self.objs and (self.objs[rid] is not r or _through_container(self.path[rid][0])):
                    continue  # on a path already (one not through a container may be upgraded)
                try:
                    links = _links(r, fids, self)
                except Exception:
                    continue
                if len(links) > 1:  # one path per object: the one through the container that grows
                    links.sort(key=lambda lk: lk[1] == "walk" and not _through_container(lk[2]))
                for cid, kind, value in links:
                    key = self.path[cid][1]
                    if key in self.named or self.budget[key] <= 0:
                        continue
                    self.budget[key] -= 1
                    if kind == "name":
                        rank = (0 if _through_container(self.path[cid][0]) else 1,
                                1 if _preference(value)[0] == 2 else 0, 0)
                        if rank == (0, 0, 0) and cid in self.old:
                            found.setdefault(key, []).append(value)
                        elif rank == (0, 0, 0):
                            self.young.setdefault(key, []).append(value)
                        elif key not in self.others or rank < self.others[key][0]:
                            self.others[key] = (rank, value)
                    elif rid not in self.objs:
                        self.objs[rid] = r
                        self.path[rid] = (value, key)
                        if cid in self.old:
                            self.old.add(rid)
                        nxt.append(r)
                        self._instance_name(r, value, key)
                    elif self.path[rid][1] == key and _through_container(value) \
                            and not _through_container(self.path[rid][0]):
                        # reached again through the container that grows (a generator's
                        # ``kept`` after its ``t``): that path names it from now on
                        self.path[rid] = (value, key)
                        if cid in self.old:
                            self.old.add(rid)
                    elif self.path[rid][1] != key and self.objs[rid] is r:
                        self.shared.setdefault(key, []).append((rid, value))  # see shared_name
            referrers.clear()
            del referrers, args
            for key, names in found.items():
                self.named[key] = min(names, key=_preference)
            self.frontier.clear()
            for key, names in self.young.items():  # no older sample reached a root of its own
                if key not in self.named and not any(self.path[id(o)][1] == key and id(o) in self.old
                                                     for o in nxt):
                    self.named[key] = min(names, key=_preference)
            self.frontier = [o for o in nxt if self.path[id(o)][1] not in self.named
                             and self.budget[self.path[id(o)][1]] > 0]
            nxt.clear()

    def shared_name(self, key: Hashable) -> str | None:
        """A group's name through an object another group named its holder through: that name,
        with the other group's path below the object replaced by this group's."""
        for rid, parts in self.shared.get(key, []):
            below, other = self.path[rid]
            name = self.named.get(other)
            suffix = render(below)
            if name is not None and suffix and name.endswith(suffix):
                return name[:len(name) - len(suffix)] + render(parts)
        return None

    def _instance_name(self, r: Any, parts: Path, key: Hashable) -> None:
        """An instance of the script's own class on the way (a LightningModule, a callback):
        ``<__main__.Lit>.step_outputs`` names it when only a library's names are found above."""
        cls = type(r)
        module = getattr(cls, "__module__", "") or ""
        if (not _through_container(parts) or module.startswith(_LIBRARY)
                or module in ("builtins", "functools", "collections")):
            return
        module = "__main__" if module == "__mp_main__" else module
        rank = (0, 0, 2)
        if key not in self.others or rank < self.others[key][0]:
            self.others[key] = (rank, f"<{module}.{cls.__qualname__}>{render(parts)}")

    def close(self) -> None:
        self.shared.clear()
        self.frontier.clear()
        self.objs.clear()
        self.path.clear()
        self.old.clear()


def _running_frames() -> set[int]:
    """The ids of every frame on some thread's stack now."""
    out: set[int] = set()
    try:
        tops = list(sys._current_frames().values())
    except Exception:
        return out
    frame: Any = None
    try:
        while tops:
            frame = tops.pop()
            while frame is not None:
                out.add(id(frame))
                frame = frame.f_back
    finally:
        frame = None
        tops.clear()
    return out


def find_holders(samples: dict[Hashable, list[Any]]) -> dict[Hashable, str | None]:
    """Per group, the name of what keeps one of its ``samples`` alive, or None. The caller's
    lists are only read; it drops them (and every other reference to the samples) after."""
    search = _Search(samples)
    try:
        search.run()
        out: dict[Hashable, str | None] = {}
        for key in samples:
            name = search.named.get(key) or search.shared_name(key)
            if name is None:
                # the container that grows before a variable naming one of its elements; the
                # script's own names before a library's (Lightning's loop locals ...)
                options = [search.others[key]] if key in search.others else []
                try:
                    local = _from_frames(search, key)
                except Exception:
                    local = None
                if local is not None:
                    options.append(local)
                name = min(options)[1] if options else None
            out[key] = name
        return out
    finally:
        search.close()


def find_holder(target: Any) -> str | None:
    """The holder of one object (see ``find_holders``)."""
    lst = [target]
    try:
        return find_holders({0: lst})[0]
    finally:
        lst.clear()


def _through_container(parts: Path) -> bool:
    """Whether a root reached with ``parts`` holds the group through a container (a list, dict,
    set of its tensors: what grows), not one tensor in a variable or attribute of its own."""
    return any(kind in ("item", "each", "cache") for kind, _ in parts)


# -- one referrer ----------------------------------------------------------------------------------

_SEQUENCES = (list, tuple, deque)
_DEAD_ENDS = (types.CodeType, types.ModuleType, types.BuiltinFunctionType)
_GENERATORS: dict[type, str] = {types.GeneratorType: "gi_frame", types.CoroutineType: "cr_frame",
                                types.AsyncGeneratorType: "ag_frame"}
# what a program keeps one of per step when it keeps the wrong thing: a container of these is
# the container that grows ([*]), not one on the way
_PER_STEP = (BaseException, types.FrameType, types.TracebackType, types.GeneratorType,
             types.CoroutineType)
_LRU_WRAPPER = type(functools.lru_cache(maxsize=None)(lambda: None))


Link = tuple[int, str, Any]  # child id, "name" or "walk", the full name or the path from the referrer


def _links(r: Any, fids: set[int], s: _Search) -> list[Link]:
    """How ``r`` refers to objects of the frontier: (child id, "name", full name) when ``r`` is
    a named root, (child id, "walk", path from ``r``) to keep walking up from ``r``."""
    tr = type(r)
    path = s.path
    if issubclass(tr, dict):  # OrderedDict (module hooks), defaultdict ... too
        mname = s.modules.get(id(r)) if tr is dict else None
        out: list[Link] = []
        for k, v in list(dict.items(r)):
            vid = id(v)
            if vid not in fids:
                continue
            parts = path[vid][0]
            if mname is not None and isinstance(k, str):
                out.append((vid, "name", f"{mname}.{k}{render(parts)}"))
            elif not parts:  # the dict holds the sample: the dict is the container
                out.append((vid, "walk", (("item", k if isinstance(k, str) else None),)))
            elif isinstance(v, _PER_STEP):
                out.append((vid, "walk", (("each", None),) + parts))
            else:
                out.append((vid, "walk", (("key", k),) + parts))
        return out
    if issubclass(tr, _SEQUENCES):  # namedtuples and list subclasses too
        base = next(b for b in _SEQUENCES if issubclass(tr, b))
        vals = list(base.__iter__(r))
        out = []
        done: set[int] = set()
        for i in compress(range(len(vals)), map(fids.__contains__, map(id, vals))):
            v = vals[i]
            if id(v) in done:
                continue
            done.add(id(v))
            parts = path[id(v)][0]
            # a list or deque holding the samples is the container; a tuple keeps its index
            part: Part = ("item", None) if not parts and base is not tuple else ("index", i)
            if parts and base is not tuple and isinstance(v, _PER_STEP):
                part = ("each", None)
            out.append((id(v), "walk", (part,) + parts))
        vals.clear()
        return out
    if tr is set or tr is frozenset:
        return [(id(v), "walk", (("item", None),) + path[id(v)][0]) for v in r if id(v) in fids]
    if tr is types.CellType:
        try:
            v = r.cell_contents
        except ValueError:
            return []
        return [(id(v), "walk", path[id(v)][0])] if id(v) in fids else []
    if tr is types.FunctionType:
        return _function(r, fids, s)
    if tr is types.MethodType:
        v = r.__self__
        return [(id(v), "walk", (("attr", "__self__"),) + path[id(v)][0])] if id(v) in fids else []
    if isinstance(r, type):
        return _class(r, fids, s)
    if tr is types.FrameType:
        return _frame(r, fids, s)
    if tr is types.TracebackType:
        return _traceback(r, fids, s)
    if tr in _GENERATORS:
        return _generator(r, tr, fids, s)
    if tr is _LRU_WRAPPER:
        return _lru(r, fids, s)
    if isinstance(r, functools.partial):
        out = []
        for attr in ("func", "args", "keywords"):
            v = getattr(r, attr, None)
            if v is not None and id(v) in fids:
                out.append((id(v), "walk", (("attr", attr),) + _as_key(path[id(v)][0])))
        return out
    if tr in _DEAD_ENDS or issubclass(tr, _tensor_base()):
        return []
    return _instance(r, fids, s)


def _qualname(code: Any) -> str:
    return str(getattr(code, "co_qualname", code.co_name))


def _local_links(frame: Any, fids: set[int], s: _Search, prefix: Path) -> list[Link]:
    """The frame's local variables that are objects of the frontier, as ``prefix`` + .name."""
    out: list[Link] = []
    items = _frame_locals(frame)
    for name, v in items:
        if id(v) in fids and s.objs.get(id(v)) is v:
            out.append((id(v), "walk", prefix + (("local", name),) + s.path[id(v)][0]))
    items.clear()
    return out


def _frame(r: Any, fids: set[int], s: _Search) -> list[Link]:
    """A frame no thread runs (a traceback's, a generator's): its locals; the traceback or
    generator that keeps it names it on the way up."""
    return _local_links(r, fids, s, ())


def _traceback(r: Any, fids: set[int], s: _Search) -> list[Link]:
    """A traceback entry: the frame it keeps (``.<frame f>``); the entries after it pass
    through (one exception keeps its whole chain)."""
    out: list[Link] = []
    frame = r.tb_frame
    if id(frame) in fids:
        out.append((id(frame), "walk", (("frame", _qualname(frame.f_code)),) + s.path[id(frame)][0]))
    nxt = r.tb_next
    if nxt is not None and id(nxt) in fids:
        out.append((id(nxt), "walk", s.path[id(nxt)][0]))
    return out


def _generator(r: Any, tr: type, fids: set[int], s: _Search) -> list[Link]:
    """A suspended generator or coroutine: the locals of its frame (``.<generator g>.name``)."""
    frame = getattr(r, _GENERATORS[tr], None)
    if frame is None or getattr(r, _GENERATORS[tr][:2] + "_running", False):
        return []
    name = _qualname(frame.f_code)
    out = _local_links(frame, fids, s, (("gen", name),))
    if id(frame) in fids:  # reached its frame object first
        out.append((id(frame), "walk", (("gen", name),) + s.path[id(frame)][0]))
    return out


def _lru(r: Any, fids: set[int], s: _Search) -> list[Link]:
    """A ``functools.lru_cache`` wrapper: its entries (the cache's dict, or the results it
    holds itself), with its maxsize and size now."""
    try:
        d = object.__getattribute__(r, "__dict__")
    except Exception:
        d = None
    try:
        info = r.cache_info()
        part: Part = ("cache", (info.maxsize, info.currsize))
    except Exception:
        part = ("cache", (None, "?"))
    out: list[Link] = []
    held = {id(o) for o in gc.get_referents(r)}  # its cache's dict, or the results it holds
    for cid in fids & held:
        child = s.objs.get(cid)
        if child is None:
            continue
        parts = s.path[cid][0]
        if d is not None and child is d:
            out.append((cid, "walk", _as_attrs(parts)))
        else:  # the cache's dict (its keys: the arguments) or a result it holds
            rest = parts[1:] if parts and parts[0][0] == "item" else parts
            out.append((cid, "walk", (part,) + rest))
    return out


def _exception(r: BaseException, fids: set[int], s: _Search) -> list[Link]:
    """What an exception keeps: its traceback (the frames it went through, and their
    locals), the exceptions it chains to and its arguments."""
    out: list[Link] = []
    for attr in ("__traceback__", "__context__", "__cause__", "args"):
        try:
            v = getattr(r, attr)
        except Exception:
            continue
        if v is not None and id(v) in fids and s.objs.get(id(v)) is v:
            out.append((id(v), "walk", (("attr", attr),) + s.path[id(v)][0]))
    return out


def _function(r: Any, fids: set[int], s: _Search) -> list[Link]:
    name = f"{getattr(r, '__module__', None) or '?'}.{r.__qualname__}"
    if name.startswith("__mp_main__."):
        name = "__main__." + name[len("__mp_main__."):]
    out: list[Link] = []
    defaults, kwdefaults, closure = r.__defaults__, r.__kwdefaults__, r.__closure__
    d = r.__dict__ if hasattr(r, "__dict__") else None
    for cid in fids:
        child = s.objs.get(cid)
        if child is None:
            continue
        parts = s.path[cid][0]
        if defaults is not None and child is defaults:
            out.append((cid, "name", f"{name}.__defaults__{render(parts)}"))
        elif kwdefaults is not None and child is kwdefaults:
            out.append((cid, "name", f"{name}.__kwdefaults__{render(_as_key(parts))}"))
        elif closure is not None and child is closure and parts and parts[0][0] == "index":
            i = parts[0][1]
            free = r.__code__.co_freevars
            var = free[i] if i < len(free) else str(i)
            out.append((cid, "name", f"{name}.<closure {var}>{render(parts[1:])}"))
        elif d is not None and child is d:
            out.append((cid, "name", f"{name}{render(_as_attrs(parts))}"))
    return out


_MISSING = object()


def _class(r: type, fids: set[int], s: _Search) -> list[Link]:
    """A class, reached through its attribute dict: a class attribute."""
    try:
        d = type.__dict__["__dict__"].__get__(r)  # mappingproxy over the dict we came up through
    except Exception:
        return []
    out: list[Link] = []
    for cid in fids:
        child = s.objs.get(cid)
        parts = s.path[cid][0]
        if type(child) is not dict or not parts or parts[0][0] not in ("key", "item"):
            continue
        k = parts[0][1]
        if isinstance(k, str) and child.get(k, _MISSING) is not _MISSING \
                and d.get(k, _MISSING) is child.get(k):
            module = getattr(r, "__module__", "?")
            module = "__main__" if module == "__mp_main__" else module
            out.append((cid, "name", f"{module}.{r.__qualname__}{render(_as_attrs(parts))}"))
    return out


def _instance(r: Any, fids: set[int], s: _Search) -> list[Link]:
    out: list[Link] = _exception(r, fids, s) if isinstance(r, BaseException) else []
    try:
        d = object.__getattribute__(r, "__dict__")
    except Exception:
        d = None
    if type(d) is dict:
        if id(d) in fids:  # came up through the instance's __dict__: its keys are attributes
            out.append((id(d), "walk", _as_attrs(s.path[id(d)][0])))
        else:
            for k, v in list(d.items()):
                if id(v) in fids and isinstance(k, str):  # values stored inline in the instance
                    out.append((id(v), "walk", _as_attrs((("item" if not s.path[id(v)][0] else "key", k),)
                                                         + s.path[id(v)][0])))
    for cls in type(r).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            try:
                v = object.__getattribute__(r, name)
            except Exception:
                continue
            if id(v) in fids:
                out.append((id(v), "walk", (("attr", name),) + s.path[id(v)][0]))
    return out


_TENSOR_BASE: type | None = None


def _tensor_base() -> type:
    global _TENSOR_BASE
    if _TENSOR_BASE is None:
        import torch

        _TENSOR_BASE = torch._C.TensorBase
    return _TENSOR_BASE


# -- frames --------------------------------------------------------------------------------------

_CO_OPTIMIZED = 0x0001  # a function's frame: f_locals is a snapshot, not the namespace


def _frame_locals(frame: Any) -> list[tuple[str, Any]]:
    """A frame's local variables. Before Python 3.13, ``frame.f_locals`` of a function frame is
    a dict snapshot stored on the frame: it would keep every local it saw alive (a tensor the
    script deletes afterwards) until something refreshes it. It is emptied right after reading.
    That is safe: whatever writes a snapshot back to the frame (a tracer's return, a debugger)
    refreshes it from the frame first; a snapshot the script holds itself (``locals()``) is left
    alone. Module and class frames' f_locals is their namespace: read only."""
    d = frame.f_locals
    items = list(d.items())
    # 3 references: the frame's, ``d`` and getrefcount's argument. More: the script holds
    # that very dict (``l = locals()``): emptying it would change what the script sees.
    if sys.version_info < (3, 13) and frame.f_code.co_flags & _CO_OPTIMIZED and type(d) is dict \
            and d is not frame.f_globals and sys.getrefcount(d) <= 3:
        d.clear()
    return items


def clear_frame_snapshots() -> int:
    """Empty the ``f_locals`` snapshots (Python < 3.13) left on the calling thread's function
    frames by whoever read them (a line tracer reading ``frame.f_locals``): each keeps the locals
    it saw alive, a stale tensor of some step for as long as the function runs. Same rules as
    ``_frame_locals``; returns how many frames were looked at."""
    if sys.version_info >= (3, 13):
        return 0
    n = 0
    try:
        frame: Any = sys._getframe(1)
    except Exception:
        return 0
    try:
        while frame is not None:
            if frame.f_code.co_flags & _CO_OPTIMIZED:
                try:
                    _frame_locals(frame).clear()
                except Exception:
                    pass
                n += 1
            frame = frame.f_back
        return n
    finally:
        del frame


def _user_frame(module: str, filename: str) -> int:
    """0: the script's own code; 1: a library's (Lightning's loop ...); 2: memscope or torch."""
    if module.startswith(("memscope", "torch")):
        return 2
    if module == "__main__" or "site-packages" not in filename:
        return 0
    return 1


def _thread_tops() -> list[tuple[str | None, Any]]:
    """(None, the calling thread's caller frame), then (thread name, top frame) of every other
    thread."""
    out: list[tuple[str | None, Any]] = [(None, sys._getframe(2))]
    me = threading.get_ident()
    try:
        frames = sys._current_frames()
    except Exception:
        return out
    names = {t.ident: t.name for t in threading.enumerate()}
    for tid, frame in frames.items():
        if tid != me:
            out.append((names.get(tid, str(tid)), frame))
    frames.clear()
    return out


def _from_frames(s: _Search, key: Hashable) -> tuple[tuple[int, int, int], str] | None:
    """A local variable of the calling thread's frames (outside memscope and torch) that holds
    an object of ``key``'s paths, ``module.function.<locals>.name``, with its rank: (through a
    container or not, library frame or the script's, 1); else of another thread's frames
    (``... (in thread 'logger')``, rank 3: a queue's consumer, a logger)."""
    best: tuple[tuple[int, int, int], str] | None = None
    try:
        tops = _thread_tops()
    except Exception:
        return None
    frame: Any = None
    try:
        for thread, frame in tops:
            while frame is not None:
                module = frame.f_globals.get("__name__", "")
                kind = _user_frame(module if isinstance(module, str) else "", frame.f_code.co_filename)
                if kind < 2:
                    try:
                        local_items = _frame_locals(frame)
                    except Exception:
                        local_items = []
                    for name, v in local_items:
                        entry = s.path.get(id(v))
                        if entry is None or entry[1] != key or s.objs.get(id(v)) is not v:
                            continue
                        rank = (0 if _through_container(entry[0]) else 1, kind, 1 if thread is None else 3)
                        if best is None or rank < best[0]:
                            qual = _qualname(frame.f_code)
                            mod = "__main__" if module == "__mp_main__" else module
                            where = f"{mod}.{qual}.<locals>.{name}" if qual != "<module>" else f"{mod}.{name}"
                            where += render(entry[0])
                            best = (rank, where if thread is None else f"{where} (in thread {thread!r})")
                    local_items.clear()
                    if best is not None and best[0][:2] == (0, 0):
                        return best
                frame = frame.f_back
        return best
    finally:
        del frame
        tops.clear()
