"""Start the agent in a process launched by ``memscope attach``, as soon as torch is imported.

The bootstrap ``sitecustomize`` calls :func:`install` in every Python process of the command.
Waiting for ``import torch`` means memscope never imports torch into a process that did not ask
for it (a tokenizer helper, ``pip``), and ``sys.argv`` is known by then.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any, Sequence

from memscope.agent.runtime.config import ENV_DB, ENV_SKIP_CHILD_OF


def install() -> None:
    if not os.environ.get(ENV_DB):
        return
    if "torch" in sys.modules:
        _start(at_torch_import=False)  # imported before this bootstrap ran: modules may exist
    else:
        sys.meta_path.insert(0, _TorchWatcher())


def _is_multiprocessing_child() -> bool:
    # spawn/forkserver children unpickle their target (and import torch) while
    # ``_inheriting`` is set; afterwards parent_process() is known. Forked children are handled
    # by the agent's at-fork hook.
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return "--multiprocessing-fork" in sys.argv
    current = mp.current_process()
    return bool(getattr(current, "_inheriting", False)) or mp.parent_process() is not None \
        or "--multiprocessing-fork" in sys.argv


def _is_torch_helper() -> bool:
    """torch's own helper processes (Inductor's compile-worker pool, its autotune subprocess):
    torch starts them as ``python <torch>/_inductor/.../file.py``, with the training's
    environment, so the bootstrap runs there too. They train nothing; recorded, each would be
    one more "rank" of the run (seen on a GPU, where torch.compile starts the pool)."""
    where = getattr(sys.modules.get("torch"), "__file__", None)
    main = sys.argv[0] if sys.argv else ""
    if not where or not main:
        return False
    inductor = os.path.join(os.path.dirname(os.path.abspath(where)), "_inductor") + os.sep
    return os.path.abspath(main).startswith(inductor)


def should_instrument() -> tuple[bool, str]:
    if _is_multiprocessing_child():
        return False, "multiprocessing child (a DataLoader worker, say)"
    if _is_torch_helper():
        return False, "torch's own helper process (Inductor's compile workers)"
    skip = os.environ.get(ENV_SKIP_CHILD_OF)
    if skip and skip == str(os.getppid()):
        return False, "launcher process (torchrun); its workers are recorded"
    return True, ""


def _start(at_torch_import: bool) -> None:
    ok, why = should_instrument()
    if not ok:
        if why.startswith("multiprocessing"):
            _watch_unrecorded_training()
        return
    try:
        from memscope.agent.runtime.api import start_from_env

        start_from_env(at_torch_import=at_torch_import)
    except Exception as exc:  # never break the user's script: say it once, carry on
        print(f"memscope: recording disabled in pid {os.getpid()}: {type(exc).__name__}: {exc}",
              file=sys.stderr)


def _watch_unrecorded_training() -> None:
    """A multiprocessing child is not recorded (DataLoader workers are many and train nothing);
    one that trains says so in the run file (memscope/agent/runtime/unrecorded.py)."""
    from memscope.agent.runtime.unrecorded import watch_unrecorded_training

    watch_unrecorded_training(os.environ[ENV_DB], "a process started by multiprocessing")


class _TorchWatcher(importlib.abc.MetaPathFinder):
    """Finds torch with the other finders, then runs ``_start`` right after torch executes."""

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # one shot, and no recursion in the lookup below
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None and spec.loader is not None:
                spec.loader = _StartAfterExec(spec.loader)
                return spec
        # torch is not installed in this interpreter: the import fails as it would without
        # memscope, and the end of the run says why nothing was recorded
        from memscope.agent.runtime.torch_missing import note_torch_missing

        note_torch_missing()
        return None


class _StartAfterExec(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # torch sees its real loader (importlib.resources and friends look at it)
        module.__loader__ = self.inner
        if module.__spec__ is not None:
            module.__spec__.loader = self.inner
        self.inner.exec_module(module)
        _start(at_torch_import=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
