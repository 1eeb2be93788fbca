"""Where a suspect leak's tensors come from: creation site (``file:line``) and module, on CPU.

Armed only once an inventory marks a group as a suspect (it grew at the last inventories), for
that group's signature, over a few step boundaries:

* **capture** (two steps from the arming boundary, the first time: a boundary at ``optimizer.step()`` falls
  between a step's forward and the code after its optimizer step, where things are often
  stored, so one step would see each part from a different iteration): a ``TorchFunctionMode`` sees the outermost
  torch call the script makes (``torch.randn``, ``t.detach()``, ``F.cross_entropy`` ...) and, for a
  result of the suspect's signature, records a *candidate*: a weak reference to the result, the
  first Python frame outside torch and memscope (``file:line``), and the module whose forward
  produced its storage (global forward hooks map output tensors to modules while capturing; a
  ``.detach()`` of a module output shares its storage). Candidates per signature are bounded.
* **store** (until one more boundary): the line that *stored* a candidate, when it is not the one
  that created it (``loss = ...`` on one line, ``history.append(loss)`` later): a line tracer on
  the candidate's frame (``sys.settrace`` with no per-call tracing, ``f_trace`` on that frame only)
  watches the candidate's reference count; the line after which it rose is where it was stored.
  Skipped when a tracer (debugger, coverage) is already installed: the site is then the creation
  line.
* **resolve** (one full step after the capture steps): candidates that died were temporaries of a
  step (``x = torch.randn(...)`` replaced by the next step's); the survivors are the leaked tensors.
  Their site (store line, else creation line) and module are the answer for the signature.
  When none survived (a leak kept every N steps, at evaluations, outside the window), the
  signature is armed again with a longer capture window (:data:`WINDOWS`: 8, then 32, then 64
  steps); after the last it goes without a site (the leak is still reported, with its holder).

Cost: Python-level work on every torch call of the capture steps and a trace call per Python call
for one more step, once per suspect (and per retry); nothing at all otherwise. Only weak references to tensors are
kept; the frame is never kept (the tracer receives it per event).

``torch.compile``: a function mode on the stack is part of Dynamo's guards (pushing one would
recompile every compiled function called under it) and global module hooks make
``OptimizedModule.__call__`` warn, so nothing is armed once Dynamo has compiled anything in the
process (the leak is still reported, with its holder, without site and module), and an arming
in progress stops the moment ``torch.compile(module)`` builds a compiled module. The mode and
hooks return at once while Dynamo traces.

Threads: the mode sits on the training thread's own (thread-local) stack. When ``disarm`` runs
on another thread (``memscope.stop()`` from the main thread while a worker thread trains), the
mode turns inert at once and the training thread pops it itself at its next Python call: the
trace function memscope set on that thread when arming sees the orphan and removes it, then
itself. (With a debugger or coverage tracer owning that thread's tracing, the inert mode stays.)
"""

from __future__ import annotations

import functools
import json
import os
import sys
import sysconfig
import threading
import weakref
from collections import Counter, deque
from typing import Any, NamedTuple

import torch
from torch.nn.modules import module as _nn_module
from torch.overrides import TorchFunctionMode

from memscope.agent.torchcompat.compiled import CompileWatch, compile_used, is_compiling, runtime_only, shield
from memscope.agent.torchcompat.module_names import module_path
from memscope.agent.torchcompat.unseen import unseen
from memscope.agent.torchcompat.handles import remove_quietly
from memscope.agent.torchcompat.storages import dtype_text, storage_address
from memscope.agent.collectors.inventory.holders import _frame_locals, clear_frame_snapshots

Signature = tuple[str, str, str, str, int, str | None]  # as in inventory.py

class Site(NamedTuple):
    """Where a leaked group's tensors are kept (``stored``: the line that put them in their
    container, else the creating line), where they were made, and by which module's forward."""

    stored: str | None
    created: str | None
    module: str | None


MAX_CANDIDATES = 32  # live per signature, in the capture steps (dead ones make room)
# capture windows (steps) of an arming and its retries: a signature whose capture found no
# surviving candidate (a leak that grows every N steps, at evaluations, between the capture's
# steps) is armed again with the next, longer window; after the last, it goes without a site
WINDOWS = (2, 8, 32, 64)
_SKIP_DIRS = tuple(os.path.dirname(str(m.__file__)) + os.sep for m in (torch,) if getattr(m, "__file__", None))
_MEMSCOPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _user_frame(frame: Any) -> Any:
    """The first frame outside torch (the code that made the torch call), or None when that is
    memscope itself (the layer profiler's pack hook detaching what autograd saves, say)."""
    while frame is not None:
        fn = frame.f_code.co_filename
        if not fn.startswith(_SKIP_DIRS) and not fn.startswith("<frozen"):
            return None if fn.startswith(_MEMSCOPE_DIR) else frame
        frame = frame.f_back
    return None


def _where(filename: str, line: int) -> str:
    """``file:line``, the file relative to the working directory when it is under it."""
    try:
        rel = os.path.relpath(filename)
        if not rel.startswith(".."):
            filename = rel
    except ValueError:
        pass
    return f"{filename}:{line}"


class _Candidate:
    __slots__ = ("sig", "ref", "created", "stored", "module", "baseline", "last_line", "holder", "caught_in",
                 "frame_kept")

    def __init__(self, sig: Signature, ref: Any, created: str, module: Any) -> None:
        self.sig = sig
        self.ref = ref
        self.created = created
        self.stored: str | None = None
        self.module = module  # weakref to the module whose forward produced its storage, or None
        self.baseline: int | None = None
        self.last_line: int | None = None
        # a local of a frame an exception's traceback keeps (it left that frame by a raise): the
        # line that stores the exception stores it (no reference to the exception is kept:
        # built-in exceptions take no weak reference, and a strong one would keep the frames)
        self.holder = False
        self.caught_in = 0  # id of the last frame that exception went through: where it is caught
        # a local of a frame that outlived its return (kept by a stored exception's traceback, a
        # suspended generator): whatever keeps the frame stored it, maybe before this window
        self.frame_kept = False


class _Mode(TorchFunctionMode):
    def __init__(self, owner: "SiteCapture") -> None:
        super().__init__()
        self.owner = owner

    @runtime_only
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if is_compiling():
            return func(*args, **(kwargs or {}))
        out = func(*args, **(kwargs or {}))
        if self.owner.capturing:
            try:
                self.owner._see(out, sys._getframe(1))
            except Exception:
                pass
        return out


class SiteCapture:
    """One arming at a time; ``boundary`` runs at every step boundary on the training thread."""

    def __init__(self) -> None:
        self.capturing = False
        self._phase: str | None = None  # None | capture | capture2 | store
        self._armed: dict[tuple[Any, ...], Signature] = {}  # torch-level match key -> signature
        self._shapes: set[tuple[int, ...]] = set()
        self._candidates: list[_Candidate] = []
        self._per_sig: Counter[Signature] = Counter()
        self._mode: _Mode | None = None
        self._hooks: list[Any] = []
        self._stack: list[Any] = []  # modules whose forward runs (capture step only)
        self._outputs: dict[int, tuple[Any, Any]] = {}  # storage ptr -> weakrefs (output, module)
        self._tracing = False
        self._thread: int | None = None
        self._pending: set[Signature] = set()
        self._tries: dict[Signature, int] = {}  # armings so far (index into WINDOWS)
        self._capture_left = 0  # capture boundaries left in this arming
        self.window = 0  # this arming's capture steps
        self.results: dict[Signature, Site] = {}
        self._watch = CompileWatch(self._on_compiled)
        self.skipped: str | None = None  # why the last arming did not happen, if it did not
        shield.add(self._hook_handles)  # out of Dynamo's sight while it compiles

    def _hook_handles(self) -> list[Any]:
        return list(self._hooks)

    # -- arming and the step boundaries --------------------------------------------------------

    @property
    def idle(self) -> bool:
        """Nothing armed and nothing waiting: a step boundary has no work here."""
        return self._phase is None and not self._pending

    def request(self, sigs: set[Signature] | frozenset[Signature]) -> None:
        """Ask for the sites of ``sigs``; capture starts at ``start_pending`` when idle."""
        self._pending |= set(sigs)

    def start_pending(self) -> None:
        """At a step boundary: start capturing for the pending signatures, unless an arming
        is in progress (they wait for it to end)."""
        if self._phase is None and self._pending:
            # signatures never armed first, in the short window: a retry's longer one would hold
            # a new suspect's site back for its whole length (a short run may end meanwhile)
            fresh = {s for s in self._pending if not self._tries.get(s)}
            sigs = fresh or self._pending
            self._pending = self._pending - sigs
            self.arm(sigs, max(WINDOWS[min(self._tries.get(s, 0), len(WINDOWS) - 1)] for s in sigs))

    def arm(self, sigs: set[Signature], steps: int = WINDOWS[0]) -> None:
        """Start capturing for ``sigs`` now (the step that starts at this boundary), for
        ``steps`` steps (at least two: see the module doc)."""
        if self._phase is not None:
            return
        armed: dict[tuple[Any, ...], Signature] = {}
        for sig in sigs:
            cat, dtype, shape, device, rg, fn = sig
            if cat not in ("activations", "other"):  # parameters, gradients, state: not made by code
                continue
            try:
                dims = tuple(int(d) for d in json.loads(shape))
            except Exception:
                continue
            armed[(dims, dtype, device, bool(rg), fn)] = sig
        if not armed:
            return
        if compile_used():
            self.skipped = "torch.compile is in use (a function mode would recompile its graphs)"
            return
        self._armed = armed
        self._shapes = {k[0] for k in armed}
        self._candidates = []
        self._per_sig = Counter()
        self._outputs = {}
        self._thread = threading.get_ident()
        self._mode = _Mode(self)
        self._mode.__enter__()
        self._hooks = [_nn_module.register_module_forward_pre_hook(self._pre),
                       _nn_module.register_module_forward_hook(self._post)]
        self._watch.install()
        for sig in armed.values():
            self._tries[sig] = self._tries.get(sig, 0) + 1
        self.window = self._capture_left = max(2, steps)
        self._phase = "capture"
        self.capturing = True
        _ACTIVE[:] = [self]
        # The trace function on this thread, from now on: it is how an orphaned mode is
        # removed by this thread (see the module doc). Not over a debugger's or coverage's.
        if sys.gettrace() is None:
            sys.settrace(_global_trace)
            self._tracing = True

    def boundary(self) -> dict[Signature, "Site"]:
        """At a step boundary: move capture -> store -> resolved. Returns the signatures
        resolved at this boundary, else {}."""
        if self._phase == "capture":
            self._capture_left -= 1
            if self._capture_left <= 1:
                self._phase = "capture2"  # the last capture step
            return {}
        if self._phase == "capture2":
            self._stop_capture()
            self._phase = "store"
            return {}
        if self._phase == "store":
            out = self._resolve()
            self.disarm()
            return out
        return {}

    def disarm(self, pending: bool = False) -> None:
        """Remove everything (also at stop, with ``pending=True``: forget the waiting ones
        too); idempotent."""
        if pending:
            self._pending = set()
        if _ACTIVE and _ACTIVE[0] is self:
            _ACTIVE.clear()
        self._stop_capture()
        if self._tracing:
            self._tracing = False
            if threading.get_ident() == self._thread:
                if sys.gettrace() is _global_trace:
                    sys.settrace(None)
            elif self._thread is not None:
                _ORPHANS.setdefault(self._thread, None)  # that thread drops its tracer itself
        self._phase = None
        self._candidates = []
        self._armed = {}
        self._outputs = {}
        self._watch.remove()

    def after_fork(self) -> None:
        """In a forked child (a DataLoader worker forked during an arming): the thread state
        came along; drop the tracer and our mode so the worker runs untraced."""
        _ACTIVE.clear()
        self.capturing = False
        self._stop_capture()
        if self._tracing:
            self._tracing = False
            if sys.gettrace() is _global_trace:
                sys.settrace(None)
        self._phase = None
        self._candidates = []

    def _stop_capture(self) -> None:
        self.capturing = False
        remove_quietly(self._hooks)
        self._hooks = []
        self._stack = []
        mode, self._mode = self._mode, None
        if mode is not None:
            try:
                # pop ours only when it is on top (a mode the script pushed since stays put; ours
                # then passes calls through untouched)
                if threading.get_ident() != self._thread:
                    if self._thread is not None:  # that thread's stack: it pops it itself
                        _ORPHANS[self._thread] = mode
                elif torch.overrides._get_current_function_mode() is mode:
                    mode.__exit__(None, None, None)
            except Exception:
                pass

    def _on_compiled(self, optimized: Any, wrapped: Any) -> None:
        """torch.compile(module) during an arming: stop capturing before the compiled module
        can be called (global hooks make it warn; the mode would recompile it)."""
        self.skipped = "torch.compile was used during the capture"
        self._stop_capture()
        self._phase = "store" if self._phase is not None else None

    # -- capture -------------------------------------------------------------------------------

    @runtime_only
    def _pre(self, module: Any, args: Any) -> None:
        if is_compiling():
            return
        if self.capturing and threading.get_ident() == self._thread:
            self._stack.append(module)

    @unseen
    @runtime_only
    def _post(self, module: Any, args: Any, output: Any) -> None:
        if is_compiling():
            return
        if not (self.capturing and threading.get_ident() == self._thread):
            return
        try:
            if self._stack and self._stack[-1] is module:
                self._stack.pop()
            if isinstance(output, torch.Tensor):
                ptr = storage_address(output.untyped_storage())
                if ptr:
                    self._outputs[ptr] = (weakref.ref(output), weakref.ref(module))
        except Exception:
            pass

    @unseen  # reading shape, grad_fn, storage of the program's tensor subclass: not seen by it
    def _see(self, out: Any, caller: Any) -> None:
        if threading.get_ident() != self._thread:
            return
        if type(out) in (tuple, list):
            for o in out[:8]:
                self._see(o, caller)
            return
        if not isinstance(out, torch.Tensor) or tuple(out.shape) not in self._shapes:
            return
        fn = out.grad_fn
        key = (tuple(out.shape), dtype_text(out), str(out.device),
               bool(out.requires_grad), type(fn).__name__ if fn is not None else None)
        sig = self._armed.get(key)
        if sig is None or (self._per_sig[sig] >= MAX_CANDIDATES and not self._room(sig)):
            return
        frame = _user_frame(caller)
        if frame is None:
            return
        self._per_sig[sig] += 1
        module = None
        ptr = storage_address(out.untyped_storage()) if out.layout is torch.strided else 0
        produced = self._outputs.get(ptr) if ptr else None
        if produced is not None:
            o = produced[0]()
            if o is not None and storage_address(o.untyped_storage()) == ptr:
                module = produced[1]
            del o
        cand = _Candidate(sig, weakref.ref(out), _where(frame.f_code.co_filename, frame.f_lineno),
                          module)
        self._candidates.append(cand)
        self._trace(frame, cand)

    def _room(self, sig: Signature) -> bool:
        """Drop ``sig``'s dead candidates (a long window's temporaries); whether one more fits."""
        self._candidates = [c for c in self._candidates if c.sig != sig or c.ref() is not None]
        self._per_sig[sig] = sum(1 for c in self._candidates if c.sig == sig)
        return self._per_sig[sig] < MAX_CANDIDATES

    # -- the line that stores a candidate --------------------------------------------------------

    def _trace(self, frame: Any, cand: _Candidate) -> None:
        current = sys.gettrace()
        if current is not None and current is not _global_trace:
            return  # a debugger or coverage owns tracing: keep the creation line
        if current is None:
            sys.settrace(_global_trace)
            self._tracing = True
        tracer = frame.f_trace
        if isinstance(tracer, _LineTracer):
            if not tracer.callee:  # a callee's tracer already watches every candidate
                tracer.cands.append(cand)
        else:
            frame.f_trace = _LineTracer(self, cand)
            frame.f_trace_lines = True

    # -- resolve -------------------------------------------------------------------------------

    def _resolve(self) -> dict[Signature, "Site"]:
        by_sig: dict[Signature, list[_Candidate]] = {}
        # the line tracers read frames' f_locals: those snapshots still hold the last capture
        # step's temporaries (a loop's `logits` from then), which would pass for survivors
        clear_frame_snapshots()
        alive = [c for c in self._candidates if c.ref() is not None]  # survived a whole step
        held = _held_in_containers([c.ref() for c in alive])
        for c in alive:
            by_sig.setdefault(c.sig, []).append(c)
        out: dict[Signature, Site] = {}
        again: set[Signature] = set()
        for sig, cands in by_sig.items():
            if not any(c.stored for c in cands) and any(c.frame_kept for c in cands):
                again.add(sig)  # stored before this window began: a longer one sees the store
            # a survivor in a container (list, dict, deque, set; not a module's globals: one
            # variable does not grow) is the leaked kind; else any survivor
            cands = [c for c in cands if id(c.ref()) in held] or cands
            site = Counter(c.stored or c.created for c in cands).most_common(1)[0][0]
            created = Counter(c.created for c in cands).most_common(1)[0][0]
            mods = Counter(m for m in (c.module() if c.module is not None else None
                                       for c in cands) if m is not None)
            name = module_path(mods.most_common(1)[0][0]) if mods else None
            mods.clear()
            out[sig] = Site(site, created, name)
        self.results.update(out)
        # nothing of a signature survived: its tensors are kept every N steps, not in these;
        # armed again with a longer window (when none is left, it goes without a site)
        for sig in (set(self._armed.values()) - set(out)) | again:
            if self._tries.get(sig, 0) < len(WINDOWS):
                self._pending.add(sig)
        return out


_CONTAINERS = (list, dict, set, deque)


def _held_in_containers(tensors: list[Any]) -> set[int]:
    """ids of the ``tensors`` some container refers to (one gc referrer scan for all)."""
    import gc

    given = tensors
    tensors = [t for t in given if t is not None]
    given.clear()
    if not tensors:
        return set()
    ids = {id(t) for t in tensors}
    modules = {id(vars(m)) for m in list(sys.modules.values()) if hasattr(m, "__dict__")}
    modules.add(id(tensors))  # not a container of the script's: our own argument list
    out: set[int] = set()
    refs = gc.get_referrers(*tensors)
    try:
        for r in refs:
            if type(r) in _CONTAINERS and id(r) not in modules:
                vals = r.values() if type(r) is dict else r
                out.update(id(v) for v in vals if id(v) in ids)
    finally:
        refs.clear()
        tensors.clear()
    return out


def _in_container(t: Any, frame: Any, match: Any = None) -> bool:
    """Whether a container the frame can name just took ``t``: the tail of a list or deque, the
    last value of a dict, a set, among the frame's local variables and their attributes and its
    module's globals (``history.append(t)``, ``self.cache[k] = t``). Cheap (no gc scan): it runs on every rise
    of a candidate's reference count, and autograd saving a tensor is such a rise too.
    ``match``: what counts as ``t`` there (default: ``t`` itself)."""
    if match is None:
        def match(x: Any) -> bool:
            return x is t
    try:
        values = list(frame.f_locals.values())
        module_vars = [] if frame.f_locals is frame.f_globals else list(frame.f_globals.values())
    except Exception:
        return False
    try:
        if any(_holds(v, match) for v in module_vars):  # a module-level list, from a function
            return True
        for v in values:
            if _holds(v, match):
                return True
            if type(v) not in _CONTAINERS and not isinstance(v, (type, torch.Tensor)):
                d = getattr(v, "__dict__", None)
                if type(d) is dict and d is not frame.f_globals:
                    if any(_holds(a, match) for a in list(d.values())[:64]):
                        return True
        return False
    finally:
        values.clear()
        module_vars.clear()


def _holds(c: Any, match: Any) -> bool:
    tc = type(c)
    if tc is list or tc is deque:
        return any(match(x) for x in list(c)[-4:]) if c else False
    if tc is dict:
        return bool(c) and match(next(reversed(c.values())))
    if tc is set:
        return any(match(x) for x in c) if len(c) < 1024 else False
    return False


def _keeps(t: Any, traced: Any) -> Any:
    """A match for an exception whose traceback keeps ``t``: a local of one of its frames that
    has returned (a frame still running, the training loop's, holds this step's variables, not
    what the exception keeps), or of such a frame of the exception it chains to. Running frames
    are not read (the ``traced`` one's snapshot is written back into its locals after the call)."""
    running = set()
    f = traced
    while f is not None:
        running.add(id(f))
        f = f.f_back

    def match(x: Any) -> bool:
        if not isinstance(x, BaseException):
            return False
        for exc in (x, x.__context__, x.__cause__):
            tb = getattr(exc, "__traceback__", None)
            depth = 0
            while tb is not None and depth < 32:
                if id(tb.tb_frame) not in running and any(v is t for _, v in _frame_locals(tb.tb_frame)):
                    return True
                tb, depth = tb.tb_next, depth + 1
        return False
    return match


def _among_locals(frame: Any, cands: list[_Candidate]) -> list[_Candidate]:
    """The candidates that are values of the traced frame's local variables now (its own
    snapshot: written back when the trace call returns, never emptied here)."""
    values = {id(v) for v in frame.f_locals.values()}
    return [c for c in cands if id(c.ref()) in values]


def _is_exception(exc_id: int) -> Any:
    """A match for the exception of that id, or one chaining to it (``raise X from e``)."""
    def match(x: Any) -> bool:
        return isinstance(x, BaseException) and exc_id in (id(x), id(x.__context__), id(x.__cause__))
    return match


_STORE_LINES = 8  # lines after an exception went through a frame where its store is looked for
_LRU_WRAPPER = type(functools.lru_cache(maxsize=None)(lambda: None))


def _is_cached(frame: Any) -> bool:
    """Whether ``frame`` runs a function that a ``functools.lru_cache`` (or ``functools.cache``)
    wraps: a module global or an attribute of ``self``'s class named as the function."""
    code = frame.f_code
    name = code.co_name
    places = [frame.f_globals]
    owner = frame.f_locals.get("self") if code.co_argcount else None
    if owner is not None:
        places.extend(vars(k) for k in type(owner).__mro__)
    for place in places:
        w = place.get(name)
        if type(w) is _LRU_WRAPPER and getattr(getattr(w, "__wrapped__", None), "__code__", None) is code:
            return True
    return False


# thread id -> a mode memscope left on that thread's stack (None: only its tracer), to be
# removed by that thread (disarmed from another one)
_ORPHANS: dict[int, Any] = {}


# the arming whose candidates are watched (at most one at a time)
_ACTIVE: list["SiteCapture"] = []
# the fewest references a traced frame had at its return (the interpreter's, the trace call's,
# getrefcount's: 5 under this tracer on CPython 3.11); one with more is kept after returning
_RETURN_REFS: list[int] = [sys.maxsize]
# frames never watched for a store: torch, memscope, the standard library
_NOT_USER = _SKIP_DIRS + (_MEMSCOPE_DIR, sysconfig.get_paths()["stdlib"] + os.sep, "<")


@runtime_only
def _global_trace(frame: Any, event: str, arg: Any) -> Any:
    if _ORPHANS:
        _sweep()
    if event == "call" and _ACTIVE:
        return _callee_tracer(frame)
    return None  # no per-call tracing otherwise: only frames given a _LineTracer are traced


def _callee_tracer(frame: Any) -> Any:
    """While candidates wait for their store line, a function of the user's called meanwhile is
    watched too: a callback that keeps ``trainer.loss`` stores it in its own frame, not in the
    loop that called it."""
    owner = _ACTIVE[0]
    if not (owner._tracing and owner._candidates) or threading.get_ident() != owner._thread:
        return None
    if frame.f_code.co_filename.startswith(_NOT_USER):
        return None
    return _LineTracer(owner, None)


def _sweep() -> None:
    """On a thread left with memscope's mode or tracer by a disarm from another thread: pop the
    mode once it is on top of this thread's stack (not while it runs, nor under a mode the
    script pushed since), then stop tracing this thread."""
    tid = threading.get_ident()
    if tid not in _ORPHANS:
        return
    mode = _ORPHANS[tid]
    try:
        if mode is not None:
            if torch.overrides._get_current_function_mode() is not mode:
                return  # ours is running, or under another mode: next call
            mode.__exit__(None, None, None)
        del _ORPHANS[tid]
        if sys.gettrace() is _global_trace:
            sys.settrace(None)
    except Exception:
        _ORPHANS.pop(tid, None)


class _LineTracer:
    """``f_trace`` of a frame that created candidates: the line after which a candidate's
    reference count rose is the line that stored it."""

    def __init__(self, owner: SiteCapture, cand: _Candidate | None) -> None:
        self.owner = owner
        # a called function's tracer watches all of the current arming's candidates
        self.callee = cand is None
        self._cands = [] if cand is None else [cand]
        # an exception went through this frame: the line that then put it (its traceback
        # keeping this frame) in a container, looked for on the next lines; when the frame
        # returns, its locals' last values are kept by it (an epoch's function that keeps
        # ``errors.append(e)``: its last batch's tensors)
        self._exc_lines = 0
        self._exc_id = 0  # id of that exception (no reference: it would keep its frames)
        self._line: int | None = None
        self._frame_store: str | None = None

    @property
    def cands(self) -> list[_Candidate]:
        # read each time: the owner's list is replaced at each arming, and a frame that runs
        # through several (an epoch's function, the training loop) keeps its tracer; a stale
        # list missed the exception a later arming's candidate was kept by
        return self.owner._candidates if self.callee else self._cands

    @runtime_only
    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if not self.owner._tracing:
            return None
        try:
            if event == "exception":
                if type(arg) is tuple and len(arg) > 2:
                    self._raised(frame, arg[2])  # (the traceback is not on the exception yet)
                if self._frame_store is None and type(arg) is tuple and len(arg) > 1:
                    self._exc_lines, self._exc_id = _STORE_LINES, id(arg[1])
                return self
            if event == "line" and self._exc_lines:
                self._exc_lines -= 1
                if self._line is not None and _in_container(None, frame, _is_exception(self._exc_id)):
                    self._frame_store = _where(frame.f_code.co_filename, self._line)
                    self._exc_lines = 0
            if event == "line":
                self._line = frame.f_lineno
            if event == "return":
                if self._frame_store is not None:
                    self._kept_with_frame(frame)
                else:
                    self._note_kept(frame)
            if event in ("line", "return"):
                line = frame.f_lineno
                for c in self.cands:
                    if c.stored is not None:
                        continue
                    t = c.ref()
                    if t is None:
                        continue
                    if c.holder:
                        # kept by an exception: the except clause's own references come and go on
                        # the storing line (``as e`` is deleted at its end): look for an exception
                        # whose traceback keeps it in a container, in the frame that caught it
                        if c.last_line is not None and id(frame) == c.caught_in \
                                and _in_container(t, frame, _keeps(t, frame)):
                            c.stored = _where(frame.f_code.co_filename, c.last_line)
                        del t
                        c.last_line = line
                        continue
                    rc = sys.getrefcount(t)
                    if c.baseline is None:
                        c.baseline = rc  # the creating line is over: what holds it now
                    elif rc > c.baseline and c.last_line is not None:
                        if _in_container(t, frame):
                            c.stored = _where(frame.f_code.co_filename, c.last_line)
                        else:  # an alias in a variable, or autograd saving it: not a store
                            c.baseline = rc
                    del t
                    c.last_line = line
            if event == "return":
                if arg is not None:
                    self._cached(frame, arg)
                self._follow(frame.f_back)
                frame.f_trace = None  # a frame a traceback keeps does not keep this tracer
        except Exception:
            return None
        return self

    def _kept_with_frame(self, frame: Any) -> None:
        """The frame returns, kept by an exception it stored: its locals' values stay."""
        for c in _among_locals(frame, [c for c in self.cands if c.stored is None]):
            c.stored = self._frame_store

    def _note_kept(self, frame: Any) -> None:
        """The frame returns and something still refers to it (more references than the fewest a
        returning frame had): its locals outlive it, kept by what keeps the frame. The store
        happened out of this tracer's sight (an epoch's exception kept before the window)."""
        rc = sys.getrefcount(frame)
        if rc < _RETURN_REFS[0]:
            _RETURN_REFS[0] = rc
        if rc <= _RETURN_REFS[0]:
            return
        cands = [c for c in self.cands if c.stored is None and not c.frame_kept and c.ref() is not None]
        for c in _among_locals(frame, cands) if cands else []:
            c.frame_kept = True

    def _raised(self, frame: Any, tb: Any) -> None:
        """An exception passes through the frame: a candidate that is a local variable of one of
        the frames its traceback keeps stays alive as long as the exception does; the line that
        stores the exception (``errors.append(e)``) is then the one that keeps the candidate."""
        for c in self.cands:
            if c.holder and c.stored is None:
                c.caught_in = id(frame)  # the exception got this far (the last one catches it)
        cands = [c for c in self.cands if c.stored is None and not c.holder and c.ref() is not None]
        if not cands:
            return
        depth = 0
        while tb is not None and cands and depth < 32:
            f = tb.tb_frame
            # the traced frame's snapshot is written back into its locals when this trace call
            # returns: read, never emptied (emptied, it would delete the frame's variables)
            values = {id(v) for v in (list(f.f_locals.values()) if f is frame else
                                      [v for _, v in _frame_locals(f)])}
            for c in [c for c in cands if id(c.ref()) in values]:
                c.holder = True
                c.caught_in = id(frame)
                c.baseline = None
                cands.remove(c)
            tb = tb.tb_next
            depth += 1

    def _cached(self, frame: Any, value: Any) -> None:
        """The frame returns a candidate from a ``functools.lru_cache``-wrapped function: the
        cache keeps it, and the line that called the cached function is its store."""
        returned = value if type(value) in (tuple, list) else (value,)
        hits = [c for c in self.cands if c.stored is None and any(c.ref() is v for v in returned[:8])]
        if not hits or not _is_cached(frame):
            return
        caller = _user_frame(frame.f_back)
        if caller is None:
            return
        where = _where(caller.f_code.co_filename, caller.f_lineno)
        for c in hits:
            c.stored = where

    def _follow(self, caller: Any) -> None:
        """The creating frame returns (a model's ``forward`` that made the loss) with candidates
        still unstored and alive: the line that keeps them is in a caller (``history.append(loss)``
        in the training loop), so its frame is traced next, from its next line on."""
        cands = [c for c in self.cands if c.stored is None and c.ref() is not None]
        if not cands or not self.owner._tracing:
            return
        caller = _user_frame(caller)  # out of torch's own frames (Module._call_impl)
        if caller is None:
            return
        for c in cands:
            c.baseline = c.last_line = None  # the caller's next line sets what holds it then
        tracer = caller.f_trace
        if isinstance(tracer, _LineTracer):
            if not tracer.callee:
                tracer.cands.extend(c for c in cands if c not in tracer.cands)
        elif tracer is None:
            caller.f_trace = _LineTracer(self.owner, cands[0])
            caller.f_trace.cands.extend(cands[1:])
            caller.f_trace_lines = True
