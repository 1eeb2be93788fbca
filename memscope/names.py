"""How a module is named to a person (floor: imports nothing of memscope).

Run files and ``--json`` keep the dotted name from ``model.named_modules()``, where the model
itself is ``""``; everything shown to a person says ``(model) RNNModel`` instead of a blank."""

from __future__ import annotations


def module_label(name: str | None, type_name: str | None = None) -> str:
    """``blocks.1.attn`` as it is; the root module ``""`` as ``(model) TYPE``; None as ``-``."""
    if name is None:
        return "-"
    if name == "":
        return f"(model) {type_name}" if type_name else "(model)"
    return name
