"""The fix for a leak as a patch of the line that stored it (pure: text in, text out).

A leak's ``site`` is the line that put its tensors where they are kept: ``history.append(loss)``,
``cache[it] = logits``, ``total_loss += loss``. What is stored there can often be made harmless
on that line alone:

* a scalar that carries a graph (a loss): store ``.item()``, a Python float;
* a tensor that carries a graph: store ``.detach()`` (same values, no graph);
* tensors without a graph (``features.append(h.detach())``): no one-line fix: how many to keep is
  the program's choice (a bounded ``deque``, clearing once used), so no patch is offered.

Only single-line statements of those shapes are patched (parsed with :mod:`ast`, the stored
expression rewritten in place); anything else gets no patch and a reason.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass

from memscope.analysis.leaks import Leak

# methods that store their (last) argument in the container they are called on
_STORING = {"append": -1, "appendleft": -1, "add": -1, "insert": -1, "put": -1, "setdefault": -1,
            "extend": None, "update": None}


@dataclass
class LinePatch:
    path: str
    line: int
    old: str
    new: str
    why: str  # what the change does, for the person reading the diff

    def unified(self, source: list[str]) -> str:
        """A unified diff of ``source`` (the file's lines, with their newlines) with this line
        replaced; paths as ``a/PATH`` and ``b/PATH`` (``patch -p1`` applies it)."""
        after = list(source)
        after[self.line - 1] = self.new + ("\n" if source[self.line - 1].endswith("\n") else "")
        return "".join(difflib.unified_diff(source, after, f"a/{self.path}", f"b/{self.path}", n=2))


def split_site(site: str) -> tuple[str, int] | None:
    """``file:line`` -> (file, line)."""
    path, _, line = site.rpartition(":")
    return (path, int(line)) if path and line.isdigit() and int(line) > 0 else None


def patch_source(lines: list[str], line: int, leak: Leak) -> tuple[str | None, str]:
    """The patched line ``line`` (from 1) of a file's ``lines``, or None and why not."""
    if not 0 < line <= len(lines):
        return None, f"the file has no line {line} now (edited since the run?)"
    return patch_line(lines[line - 1], leak)


def patch_line(text: str, leak: Leak) -> tuple[str | None, str]:
    """(the patched line, why) or (None, why not) for the line ``text`` that stored ``leak``."""
    if not leak.grad_fn:
        return None, ("its tensors carry no autograd graph: how many to keep is the program's "
                      "choice (collections.deque(maxlen=N), or clear the container once used)")
    stripped = text.lstrip()
    indent = text[:len(text) - len(stripped)]
    try:
        tree = ast.parse(stripped.rstrip("\n"))
    except SyntaxError:
        return None, "the storing statement spans several lines: edit it by hand"
    if len(tree.body) != 1:
        return None, "several statements on the line: edit it by hand"
    value = _stored(tree.body[0])
    if value is None:
        return None, "not an append, an assignment or a +=: edit it by hand"
    seg = ast.get_source_segment(stripped, value)
    if seg is None:
        return None, "the stored expression could not be located on the line"
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
    start = _offset(stripped, value.lineno, value.col_offset)
    end = _offset(stripped, value.end_lineno or value.lineno, value.end_col_offset or 0)
    return indent + stripped[:start] + new_seg + stripped[end:].rstrip("\n"), why


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
