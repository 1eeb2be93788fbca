"""The fix for a leak as a patch of the line that stored it (pure: text in, text out).

A leak's ``site`` is the line that put its tensors where they are kept: ``history.append(loss)``,
``cache[it] = logits``, ``total_loss += loss``. What is stored there can often be made harmless
on that line alone:

* a scalar that carries a graph (a loss): store ``.item()``, a Python float;
* a tensor that carries a graph: store ``.detach()`` (same values, no graph);
* tensors without a graph (``features.append(h.detach())``): no one-line fix: how many to keep is
  the program's choice (a bounded ``deque``, clearing once used), so no patch is offered.

Some holders are fixed elsewhere than on the storing line, from what ``held_by`` names:

* an exception kept with its traceback (``errors.append(e)``: held by ``...[*].__traceback__...``):
  the storing line keeps ``e.with_traceback(None)`` (``str(e)`` when the path goes through a
  chained exception's ``__context__``/``__cause__``): the frames go, the exception stays;
* a ``functools.lru_cache(maxsize=None)`` / ``functools.cache`` (``...<lru_cache maxsize=None``):
  its decorator gets ``maxsize=128`` (lru_cache's own default);
* a ``queue.Queue`` that grows (``....queue``, stored by ``q.put(...)``): its constructor gets
  ``maxsize=8``, so ``put`` waits for the consumer (back-pressure) instead of keeping every step.

Only single-line statements of those shapes are patched (parsed with :mod:`ast`, the stored
expression rewritten in place); anything else gets no patch and a reason.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass

from memscope.analysis.leaks import Leak

# methods that store their (last) argument in the container they are called on
_STORING = {"append": -1, "appendleft": -1, "add": -1, "insert": -1, "put": -1, "setdefault": -1,
            "extend": None, "update": None}


@dataclass
class Edit:
    """Lines ``line`` .. ``line + count - 1`` (from 1) replaced by ``new`` (``count`` 0: ``new``
    inserted before ``line``); ``new`` without newlines."""

    line: int
    count: int
    new: list[str]


@dataclass
class Plan:
    """The change that fixes a leak: edits of one file, and what they do."""

    edits: list[Edit]
    why: str

    @property
    def line(self) -> int:
        return min(e.line for e in self.edits)

    def apply(self, lines: list[str]) -> list[str]:
        out = list(lines)
        for e in sorted(self.edits, key=lambda e: -e.line):  # bottom-up: line numbers hold
            nl = "\n" if not out or (out[min(e.line, len(out)) - 1].endswith("\n")) else ""
            out[e.line - 1:e.line - 1 + e.count] = [t + "\n" for t in e.new[:-1]] + [e.new[-1] + nl] \
                if e.new else []
        return out

    def old_text(self, lines: list[str]) -> str:
        return "".join("".join(lines[e.line - 1:e.line - 1 + e.count]) for e in self.edits).rstrip("\n")

    def new_text(self) -> str:
        return "\n".join(t for e in self.edits for t in e.new)

    def unified(self, path: str, source: list[str]) -> str:
        """A unified diff of ``source`` (the file's lines, with their newlines) with the edits
        made; paths as ``a/PATH`` and ``b/PATH`` (``patch -p1`` applies it)."""
        return "".join(difflib.unified_diff(source, self.apply(source), f"a/{path}", f"b/{path}", n=2))


CACHE_MAXSIZE = 128  # functools.lru_cache's own default
QUEUE_MAXSIZE = 8


def plan_fix(lines: list[str], line: int, leak: Leak) -> tuple[Plan | None, str]:
    """The change of a file's ``lines`` that fixes ``leak``, stored at ``line`` (from 1), or
    None and why not."""
    if not 0 < line <= len(lines):
        return None, f"the file has no line {line} now (edited since the run?)"
    held = leak.held_by or ""
    if ".__traceback__" in held:
        return _one(line, *_traceback_line(lines[line - 1], held))
    if "<lru_cache maxsize=" in held:
        return _lru_cache(lines, held)
    if held.endswith(".queue") and ".put" in lines[line - 1]:
        return _queue(lines, line)
    return _one(line, *patch_line(lines[line - 1], leak))


def _one(line: int, new: str | None, why: str) -> tuple[Plan | None, str]:
    return (Plan([Edit(line, 1, [new])], why) if new is not None else None), why


def _stored_expr(text: str) -> tuple[ast.expr, str, str, str] | str:
    """(the stored expression, its source, the line without its indent, the indent) of a
    storing line, or why there is none."""
    stmt, stripped, indent = _statement(text)
    if stmt is None:
        return stripped
    value = _stored(stmt)
    if value is None:
        return "not an append, an assignment or a +=: edit it by hand"
    seg = ast.get_source_segment(stripped, value)
    if seg is None:
        return "the stored expression could not be located on the line"
    return value, seg, stripped, indent


def _traceback_line(text: str, held: str) -> tuple[str | None, str]:
    """``errors.append(e)`` -> ``errors.append(e.with_traceback(None))`` (``str(e)`` when a
    chained exception's traceback keeps them)."""
    found = _stored_expr(text)
    if isinstance(found, str):
        return None, found
    value, seg, stripped, indent = found
    chained = "__context__" in held or "__cause__" in held
    new_seg = f"str({seg})" if chained else f"{seg}.with_traceback(None)"
    why = ("the exception's message instead of the exception: a chained exception's traceback keeps "
           "every frame it went through and their local variables" if chained else
           "the exception without its traceback, which keeps every frame it went through and their "
           "local variables (tensors, and the graphs they carry) alive; or keep str(e)")
    return _replace(stripped, indent, value, new_seg), why


def _lru_cache(lines: list[str], held: str) -> tuple[Plan | None, str]:
    """The cached function's decorator, bounded."""
    name = held.split("<lru_cache", 1)[0].rsplit(".", 1)[-1]
    defs = [i for i, t in enumerate(lines) if re.match(rf"\s*(async\s+)?def\s+{re.escape(name)}\s*\(", t)]
    why = (f"a bounded cache: {name} keeps one result per distinct argument; maxsize={CACHE_MAXSIZE} "
           "keeps the most recent (choose how many the program needs)")
    for d in defs:
        i = d - 1
        while i >= 0 and lines[i].lstrip().startswith("@"):
            text = lines[i].rstrip("\n")
            new = _bounded_decorator(text)
            if new is not None:
                return Plan([Edit(i + 1, 1, [new])], why), why
            i -= 1
    return None, (f"the lru_cache decorator of {name} is not in this file: give it "
                  f"maxsize={CACHE_MAXSIZE} where it is defined")


def _bounded_decorator(text: str) -> str | None:
    """``@functools.lru_cache(maxsize=None)`` / ``@lru_cache(None)`` / ``@functools.cache`` /
    ``@cache``, with a maxsize."""
    m = re.match(r"^(\s*@\s*)([\w.]*?)(lru_cache|cache)(\s*\(([^)]*)\))?(\s*(#.*)?)$", text)
    if m is None:
        return None
    lead, prefix, kind, call, inner, tail = m.group(1), m.group(2), m.group(3), m.group(4), m.group(5), m.group(6)
    if kind == "cache":
        if call:
            return None
        return f"{lead}{prefix}lru_cache(maxsize={CACHE_MAXSIZE}){tail}"
    if not call:  # @lru_cache: maxsize 128 already
        return None
    args = [a.strip() for a in (inner or "").split(",") if a.strip()]
    if not args:
        return None
    if args[0] == "None":
        args[0] = str(CACHE_MAXSIZE)
    elif args[0].replace(" ", "") == "maxsize=None":
        args[0] = f"maxsize={CACHE_MAXSIZE}"
    else:
        return None
    return f"{lead}{prefix}lru_cache({', '.join(args)}){tail}"


def _queue(lines: list[str], line: int) -> tuple[Plan | None, str]:
    """``q.put(x)`` into a growing queue: the line that made ``q``, with a maxsize."""
    stmt, stripped, _ = _statement(lines[line - 1])
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr in ("put", "put_nowait")):
        return None, "not a put() on a queue: bound the queue by hand (queue.Queue(maxsize=N))"
    target = ast.get_source_segment(stripped, call.func.value) or ""
    why = (f"a bounded queue: put() then waits while {QUEUE_MAXSIZE} items wait for the consumer "
           "(back-pressure: the loop slows to the consumer's pace instead of keeping every step's "
           "tensors); or drain it faster")
    pattern = re.compile(rf"^(\s*){re.escape(target)}\s*(:[^=]+)?=\s*.*\b(Queue|SimpleQueue|JoinableQueue)\s*\(")
    for i, text in enumerate(lines):
        if not pattern.match(text):
            continue
        new = _bounded_queue(text.rstrip("\n"))
        if new is not None:
            return Plan([Edit(i + 1, 1, [new])], why), why
    return None, f"the line that made {target} is not in this file: give its Queue maxsize={QUEUE_MAXSIZE}"


def _bounded_queue(text: str) -> str | None:
    stmt, stripped, indent = _statement(text + "\n")
    if stmt is None or not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or not isinstance(stmt.value, ast.Call):
        return None
    call = stmt.value
    func = ast.get_source_segment(stripped, call.func) or ""
    if func.endswith("SimpleQueue"):
        func = func[:-len("SimpleQueue")] + "Queue"
    elif call.args or any(k.arg == "maxsize" for k in call.keywords):
        size = call.args[0] if call.args else next(k.value for k in call.keywords if k.arg == "maxsize")
        infinite = (isinstance(size, ast.Constant) and size.value in (0, None)) or (
            isinstance(size, ast.UnaryOp) and isinstance(size.op, ast.USub))  # 0 or less: no bound
        if not infinite:
            return None  # bounded already
        rest = [ast.get_source_segment(stripped, a) or "" for a in call.args[1:]]
        rest += [ast.get_source_segment(stripped, k) or "" for k in call.keywords if k.arg != "maxsize"]
        new = f"{func}({', '.join([f'maxsize={QUEUE_MAXSIZE}', *rest])})"
        return _replace(stripped, indent, call, new)
    rest = [ast.get_source_segment(stripped, k) or "" for k in call.keywords]
    return _replace(stripped, indent, call, f"{func}({', '.join([f'maxsize={QUEUE_MAXSIZE}', *rest])})")


def _statement(text: str) -> tuple[ast.stmt | None, str, str]:
    """(the one statement on the line, the line without its indent, the indent); (None, why, "")
    when the line is not one statement."""
    stripped = text.lstrip()
    indent = text[:len(text) - len(stripped)]
    try:
        tree = ast.parse(stripped.rstrip("\n"))
    except SyntaxError:
        return None, "the storing statement spans several lines: edit it by hand", ""
    if len(tree.body) != 1:
        return None, "several statements on the line: edit it by hand", ""
    return tree.body[0], stripped, indent


def _replace(stripped: str, indent: str, node: ast.expr, new_seg: str) -> str:
    start = _offset(stripped, node.lineno, node.col_offset)
    end = _offset(stripped, node.end_lineno or node.lineno, node.end_col_offset or 0)
    return indent + stripped[:start] + new_seg + stripped[end:].rstrip("\n")


_REGISTERING = ("register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
                "register_backward_hook", "register_full_backward_pre_hook", "register_hook",
                "register_post_accumulate_grad_hook", "register_state_dict_pre_hook",
                "register_state_dict_post_hook", "register_load_state_dict_pre_hook",
                "register_load_state_dict_post_hook", "register_module_forward_hook",
                "register_module_forward_pre_hook", "register_module_full_backward_hook")


def plan_hoist(lines: list[str], line: int) -> tuple[Plan | None, str]:
    """A hook registered inside a loop (at ``line``), registered once before it instead, its
    handle kept (``stash_handle = model.fc.register_forward_hook(stash)``): the registering
    statement (and the ``if`` blocks around it in the loop, when they hold nothing else) moves
    above the loop, when nothing it names is changed by the loop."""
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return None, "the file does not parse: move the registration out of the loop by hand"
    chain = _chain_to(tree, line)
    if not chain:
        return None, f"no statement starts at line {line}: move the registration out of the loop by hand"
    stmt = chain[-1]
    call = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, (ast.Attribute, ast.Name))
            and (call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id) in _REGISTERING) \
            or stmt.end_lineno != stmt.lineno:
        return None, "not a one-line hook registration: move it out of the loop by hand"
    loop_at = next((i for i in range(len(chain) - 2, -1, -1)
                    if isinstance(chain[i], (ast.For, ast.While, ast.AsyncFor))), None)
    stop = next((i for i in range(len(chain) - 2, -1, -1)
                 if isinstance(chain[i], (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))), -1)
    if loop_at is None or loop_at < stop:
        return None, "the registration is not inside a loop: register it once, where the model is built"
    loop = chain[loop_at]
    assert isinstance(loop, (ast.For, ast.While, ast.AsyncFor))
    block = chain[loop_at + 1]  # the statement of the loop's body that holds the registration
    for node, child in zip(chain[loop_at + 1:-1], chain[loop_at + 2:]):
        if not (isinstance(node, ast.If) and not node.orelse and node.body == [child]):
            return None, "the registration is nested in the loop with other code: move it out by hand"
    if len(loop.body) == 1:
        return None, "the loop does nothing else: move the registration out of it by hand"
    changed = {n.id for n in ast.walk(loop) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    used = {n.id for node in chain[loop_at + 1:] for n in ast.walk(node.test if isinstance(node, ast.If) else node)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if used & changed:
        return None, (f"it uses {', '.join(sorted(used & changed))}, which the loop changes: register "
                      "the hook once, before the loop, by hand")
    indent = lines[loop.lineno - 1][:len(lines[loop.lineno - 1]) - len(lines[loop.lineno - 1].lstrip())]
    inner = lines[block.lineno - 1][:len(lines[block.lineno - 1]) - len(lines[block.lineno - 1].lstrip())]
    moved: list[str] = []
    for n in range(block.lineno, (block.end_lineno or block.lineno) + 1):
        text = lines[n - 1].rstrip("\n")
        if n == stmt.lineno and isinstance(stmt, ast.Expr):
            head = text[:len(text) - len(text.lstrip())]
            arg = call.args[0] if call.args else None
            handle = f"{arg.id}_handle" if isinstance(arg, ast.Name) else "hook_handle"
            text = f"{head}{handle} = {text.lstrip()}"
        moved.append(indent + text[len(inner):] if text.startswith(inner) else text)
    count = (block.end_lineno or block.lineno) - block.lineno + 1
    why = ("registered once, before the loop, its handle kept (handle.remove() when the hook is no "
           "longer needed): registered at every step, each new hook ran at every call from then on")
    return Plan([Edit(loop.lineno, 0, moved), Edit(block.lineno, count, [])], why), why


def _chain_to(tree: ast.AST, line: int) -> list[ast.stmt]:
    """The statements from the module down to the one starting at ``line`` (its ancestors)."""
    chain: list[ast.stmt] = []
    node: ast.AST = tree
    while True:
        children = [c for f in ("body", "orelse", "finalbody", "handlers") for c in getattr(node, f, []) or []
                    if isinstance(c, (ast.stmt, ast.excepthandler))]
        nxt = next((c for c in children if c.lineno <= line <= (c.end_lineno or c.lineno)), None)
        if nxt is None:
            return chain if chain and chain[-1].lineno == line else []
        if isinstance(nxt, ast.stmt):
            chain.append(nxt)
        if nxt.lineno == line and isinstance(nxt, ast.stmt) and not isinstance(
                nxt, (ast.For, ast.While, ast.AsyncFor, ast.If, ast.With, ast.Try, ast.FunctionDef,
                      ast.AsyncFunctionDef, ast.ClassDef)):
            return chain
        node = nxt


def split_site(site: str) -> tuple[str, int] | None:
    """``file:line`` -> (file, line)."""
    path, _, line = site.rpartition(":")
    return (path, int(line)) if path and line.isdigit() and int(line) > 0 else None


def patch_line(text: str, leak: Leak) -> tuple[str | None, str]:
    """(the patched line, why) or (None, why not) for the line ``text`` that stored ``leak``."""
    if not leak.grad_fn:
        return None, ("its tensors carry no autograd graph: how many to keep is the program's "
                      "choice (collections.deque(maxlen=N), or clear the container once used)")
    found = _stored_expr(text)
    if isinstance(found, str):
        return None, found
    value, seg, stripped, indent = found
    scalar = leak.shape == []
    if seg.endswith(".detach()") and scalar:
        new_seg, why = seg[:-len(".detach()")] + ".item()", "a Python float instead of a tensor"
    elif seg.endswith((".item()", ".detach()", ".tolist()")):
        return None, f"the line already stores {seg}: the kept tensors come from elsewhere"
    else:
        simple = isinstance(value, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))
        base = seg if simple else f"({seg})"
        if scalar:
            new_seg, why = base + ".item()", "a Python float instead of a tensor that keeps its autograd graph"
        else:
            new_seg, why = base + ".detach()", "the same values without the autograd graph"
    if leak.every >= 5:
        why += ("; it grows every ~%g steps: if that is an evaluation, also run it under "
                "`with torch.no_grad():`" % leak.every)
    return _replace(stripped, indent, value, new_seg), why


def _stored(stmt: ast.stmt) -> ast.expr | None:
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, (ast.Add, ast.Sub)):
        return stmt.value
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(
            stmt.targets[0], (ast.Subscript, ast.Attribute)):
        return stmt.value
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        if isinstance(call.func, ast.Attribute) and call.func.attr in _STORING and call.args:
            index = _STORING[call.func.attr]
            return call.args[index] if index is not None else None
    return None


def _offset(text: str, lineno: int, col: int) -> int:
    """Character offset of (line, UTF-8 byte column) in ``text``."""
    lines = text.splitlines(keepends=True)
    before = "".join(lines[:lineno - 1])
    return len(before) + len(lines[lineno - 1].encode()[:col].decode(errors="replace"))
