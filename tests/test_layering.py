"""The dependency arrows stay one-way (DESIGN.md section 3).

Every ``import`` in memscope/ and tui/, at module level or inside a function, is checked against
the layers each part may use. A new upward import fails here with the file and line."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOOR = {"memscope", "memscope.units", "memscope.constants", "memscope.errors", "memscope.names",
         "memscope.display", "memscope.quiet_thread", "memscope.turns", "memscope.redact",
         "memscope.safe_files", "memscope.name_clash"}

# part -> the memscope parts its modules may import (besides the floor and themselves)
ALLOWED: dict[str, set[str]] = {
    "memscope.store": set(),
    "memscope.agent": {"memscope.store"},
    "memscope.analysis": {"memscope.store"},
    "memscope.report": {"memscope.analysis", "memscope.store"},
    # runners launch training processes: they read the agent's options (no torch) and the store
    "memscope.runners": {"memscope.agent.runtime.config", "memscope.analysis", "memscope.report", "memscope.store"},
    "memscope.integrations": {"memscope.agent"},
    # node: processes memscope did not launch (attach --pid, top, daemon); reads them from outside
    "memscope.node": {"memscope.agent.runtime.config", "memscope.analysis", "memscope.store"},
    # the reading API (memscope.load): the report contract, the timeline model, the notebook view
    "memscope.reading": {"memscope.analysis", "memscope.report", "memscope.store"},
    "memscope.cli": {"memscope.analysis", "memscope.report", "memscope.runners", "memscope.store",
                     "memscope.agent.runtime.config", "memscope.node"},
    # the top view draws what memscope.node samples (no torch, no analysis of its own)
    "memscope_tui": {"memscope.analysis", "memscope.store", "memscope.node"},
}
# modules that import nothing of memscope above the floor
FLOOR_ONLY = {"memscope.units", "memscope.constants", "memscope.errors", "memscope.names",
              "memscope.display", "memscope.quiet_thread", "memscope.turns", "memscope.redact",
              "memscope.safe_files", "memscope.name_clash"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT / "tui" if path.is_relative_to(ROOT / "tui") else ROOT)
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _part(module: str) -> str | None:
    for part in ALLOWED:
        if module == part or module.startswith(part + "."):
            return part
    return None


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[int, str]] = []
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            out += [(node.lineno, f"{base}.{a.name}" if a.name != "*" else base) for a in node.names]
    return out


def _allowed(source_part: str | None, source: str, target: str) -> bool:
    if not (target.startswith("memscope.") or target == "memscope" or target.startswith("memscope_tui")):
        return True
    if any(target == f or target.startswith(f + ".") for f in FLOOR - {"memscope"}) or target == "memscope":
        return True
    if target.startswith("memscope.__version__"):
        return True
    if source in FLOOR_ONLY:
        return False
    if source_part is None:  # memscope/__init__, __main__: the public entry points
        return True
    target_part = _part(target)
    if target_part == source_part:
        return True
    return any(target == a or target.startswith(a + ".") for a in ALLOWED[source_part])


def test_imports_point_one_way() -> None:
    files = sorted((ROOT / "memscope").rglob("*.py")) + sorted((ROOT / "tui" / "memscope_tui").rglob("*.py"))
    assert len(files) > 50
    bad = []
    for path in files:
        source = _module_name(path)
        part = _part(source)
        for line, target in _imports(path):
            if not _allowed(part, source, target):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {source} imports {target}")
    assert not bad, "imports against the arrows:\n" + "\n".join(bad)


def test_reading_side_never_imports_torch() -> None:
    for part in ("store", "analysis", "report", "cli", "runners", "node", "reading.py"):
        for path in sorted((ROOT / "memscope" / part).rglob("*.py")) if not part.endswith(".py") else [
                ROOT / "memscope" / part]:
            for line, target in _imports(path):
                assert not (target == "torch" or target.startswith("torch.")), \
                    f"{path.relative_to(ROOT)}:{line} imports {target}"


def test_checker_catches_an_upward_import(tmp_path: Path) -> None:
    # the checker itself can fail: an agent module importing analysis is caught
    assert not _allowed("memscope.agent", "memscope.agent.collectors.inventory", "memscope.analysis.leaks.WARMUP_STEPS")
    assert not _allowed("memscope.analysis", "memscope.analysis.x", "memscope.runners.supervisor.run_child")
    assert not _allowed("memscope.store", "memscope.store.x", "memscope.report.format.iso")
    assert not _allowed("memscope_tui", "memscope_tui.app", "memscope.report.text.render")
    assert _allowed("memscope.report", "memscope.report.text", "memscope.units.human_bytes")
