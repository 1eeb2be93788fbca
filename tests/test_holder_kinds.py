"""The holder search on the holders real code has, in this process (tests/test_real_leaks.py runs
them under attach): an exception's traceback and the exceptions it chains to, a coroutine's and a
generator's frame, a bounded and an unbounded functools.lru_cache, a deque another thread's
running function owns. And the search keeps nothing alive: with the collector off, a tensor it
looked at dies when the program drops it."""

from __future__ import annotations

import functools
import gc
import threading
import weakref
from collections import deque
from typing import Any

import torch

from memscope.agent.collectors.inventory.holders import find_holder

KEPT: list[Any] = []


def _fail_with(t: torch.Tensor) -> None:
    local = t * 2  # noqa: F841 - what the traceback keeps
    raise ValueError("no")


def test_an_exception_context_keeps_a_frame() -> None:
    try:
        try:
            _fail_with(torch.ones(3))
        except ValueError:
            raise KeyError("while handling")  # noqa: B904 - the implicit chain is the case under test
    except KeyError as e:
        KEPT.append(e)
    (t,) = [o for o in gc.get_objects() if type(o) is torch.Tensor and o.shape == (3,) and o[0].item() == 2.0]
    try:
        assert find_holder(t) == f"{__name__}.KEPT[*].__context__.__traceback__.<frame _fail_with>.local"
    finally:
        KEPT.clear()


CACHED: Any = None


def test_lru_caches_bounded_and_not() -> None:
    global CACHED

    for maxsize in (None, 4):
        @functools.lru_cache(maxsize=maxsize)
        def table(i: int) -> torch.Tensor:
            return torch.full((2,), float(i))

        CACHED = table
        t = table(7)
        table(8)
        assert find_holder(t) == f"{__name__}.CACHED<lru_cache maxsize={maxsize}, 2 entries>", maxsize
        del t
    CACHED = None


def test_a_suspended_coroutine_and_generator() -> None:
    async def coro(t: torch.Tensor) -> None:
        kept = [t]  # noqa: F841
        del t  # one path to it (the argument's local was a second, equal one: either could be named)
        await _Never()

    def gen(t: torch.Tensor) -> Any:
        box = [t]  # noqa: F841
        del t
        yield

    a, b = torch.ones(5), torch.ones(6)
    c = coro(a)
    c.send(None)
    g = gen(b)
    next(g)
    KEPT[:] = [c, g]
    del a, b
    try:
        ta = [o for o in gc.get_objects() if type(o) is torch.Tensor and o.shape == (5,)][0]
        tb = [o for o in gc.get_objects() if type(o) is torch.Tensor and o.shape == (6,)][0]
        here = f"{__name__}.KEPT[*].<generator test_a_suspended_coroutine_and_generator.<locals>"
        assert find_holder(ta) == f"{here}.coro>.kept"
        assert find_holder(tb) == f"{here}.gen>.box"
    finally:
        c.close()
        KEPT.clear()


class _Never:
    def __await__(self) -> Any:
        yield


def test_a_deque_another_thread_owns() -> None:
    handed: deque[torch.Tensor] = deque()
    ready, done = threading.Event(), threading.Event()

    def owner() -> None:
        mine = deque()  # the local of a running function of another thread
        mine.append(handed.popleft())
        ready.set()
        done.wait(10)

    handed.append(torch.ones(7))
    th = threading.Thread(target=owner, name="owner")
    th.start()
    try:
        assert ready.wait(10)
        (t,) = [o for o in gc.get_objects() if type(o) is torch.Tensor and o.shape == (7,)]
        assert find_holder(t) == (f"{__name__}.test_a_deque_another_thread_owns.<locals>.owner.<locals>.mine "
                                  "(in thread 'owner')")
        del t
    finally:
        done.set()
        th.join(10)


def test_the_search_keeps_nothing_alive_with_the_collector_off() -> None:
    """Frames of the search on the stack while it runs (the sample is a local there) must not
    end up in a cycle: a script that called gc.disable() would keep that tensor for good."""
    was = gc.isenabled()
    gc.disable()
    try:
        t = torch.ones(9)
        KEPT.append(t)
        ref = weakref.ref(t)
        find_holder(t)
        del t
        KEPT.clear()
        assert ref() is None
    finally:
        if was:
            gc.enable()
