"""The fixes of the holders real code has (tests/test_real_leaks.py runs them): a kept
exception, an unbounded lru_cache, an unbounded queue, a hook registered inside a loop. The
rules on lines and files of each shape, and the shapes they refuse (with why)."""

from __future__ import annotations

import pytest

from memscope.analysis.leak_patch import plan_fix, plan_hoist
from memscope.analysis.leaks import Leak


def leak(held_by: str, grad_fn: str | None = None) -> Leak:
    return Leak(4, 1.0, [4], "float32", "other", held_by, None, None, 2, 9, grad_fn=grad_fn)


def fix(source: str, line: int, held_by: str) -> tuple[str | None, str]:
    lines = source.splitlines(keepends=True)
    plan, why = plan_fix(lines, line, leak(held_by))
    return ("".join(plan.apply(lines)) if plan else None), why


TB = "__main__.errors[*].__traceback__.<frame check>.scaled"


@pytest.mark.parametrize("line,held_by,new", [
    ("    errors.append(e)\n", TB, "    errors.append(e.with_traceback(None))\n"),
    ("    self.failures[step] = err  # keep\n", TB, "    self.failures[step] = err.with_traceback(None)  # keep\n"),
    ("    errors.append(e)\n", "__main__.errors[*].__context__.__traceback__.<frame f>.t",
     "    errors.append(str(e))\n"),
])
def test_a_kept_exception_loses_its_traceback(line: str, held_by: str, new: str) -> None:
    got, why = fix(line, 1, held_by)
    assert got == new, why


CACHE = "__main__.table<lru_cache maxsize=None, 58 entries>"


@pytest.mark.parametrize("decorator,new", [
    ("@functools.lru_cache(maxsize=None)", "@functools.lru_cache(maxsize=128)"),
    ("@lru_cache(None)", "@lru_cache(128)"),
    ("@functools.cache", "@functools.lru_cache(maxsize=128)"),
    ("@cache  # memo", "@lru_cache(maxsize=128)  # memo"),
    ("@functools.lru_cache(maxsize=None, typed=True)", "@functools.lru_cache(maxsize=128, typed=True)"),
])
def test_an_unbounded_cache_gets_a_maxsize(decorator: str, new: str) -> None:
    src = f"import functools\n\n{decorator}\ndef table(step):\n    return step\n\ntable(3)\n"
    got, why = fix(src, 7, CACHE)
    assert got == src.replace(decorator, new), why


def test_a_cache_defined_elsewhere_says_where_to_bound_it() -> None:
    got, why = fix("from mod import table\ntable(3)\n", 2, CACHE)
    assert got is None and "maxsize=128 where it is defined" in why


@pytest.mark.parametrize("made,new", [
    ("q = queue.Queue()", "q = queue.Queue(maxsize=8)"),
    ("q = Queue(0)", "q = Queue(maxsize=8)"),
    ("q: queue.Queue = queue.Queue(maxsize=-1)", "q: queue.Queue = queue.Queue(maxsize=8)"),
    ("q = queue.SimpleQueue()", "q = queue.Queue(maxsize=8)"),
])
def test_an_unbounded_queue_gets_a_maxsize(made: str, new: str) -> None:
    src = f"import queue\n{made}\nfor i in range(3):\n    q.put(i)\n"
    got, why = fix(src, 4, "__main__.q.queue")
    assert got == src.replace(made, new), why


def test_a_bounded_queue_is_left_alone() -> None:
    got, why = fix("import queue\nq = queue.Queue(100)\nq.put(1)\n", 3, "__main__.q.queue")
    assert got is None and "maxsize=8" in why


LOOP = """def train(model, stash, loader):
    every = True
    for batch in loader:
        if every:
            model.fc.register_forward_hook(stash)
        model(batch)
"""


def test_a_hook_registered_in_a_loop_is_registered_once_before_it() -> None:
    lines = LOOP.splitlines(keepends=True)
    plan, why = plan_hoist(lines, 5)
    assert plan is not None, why
    assert "".join(plan.apply(lines)) == """def train(model, stash, loader):
    every = True
    if every:
        stash_handle = model.fc.register_forward_hook(stash)
    for batch in loader:
        model(batch)
"""


@pytest.mark.parametrize("source,line,why", [
    ("for b in loader:\n    b.register_hook(f)\n    step(b)\n", 2, "uses b, which the loop changes"),
    ("model.register_forward_hook(f)\n", 1, "not inside a loop"),
    ("for b in loader:\n    if b:\n        m.register_forward_hook(f)\n    else:\n        pass\n    step()\n", 3,
     "nested in the loop with other code"),
    ("for b in loader:\n    m.register_forward_hook(f)\n", 2, "does nothing else"),
    ("for b in loader:\n    m.register_forward_hook(\n        f)\n    step()\n", 2, "not a one-line hook"),
])
def test_a_hook_that_cannot_move_says_why(source: str, line: int, why: str) -> None:
    plan, reason = plan_hoist(source.splitlines(keepends=True), line)
    assert plan is None and why in reason, reason
