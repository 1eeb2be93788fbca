"""A table with a ``torch.compile``'d module says what it cannot show: the submodules of a
compiled graph are not called as modules, so their bytes are the compiled module's one row (real
nanoGPT on a GPU, compiled as it is by default, showed one row at 100% and no word why). The
``layers`` command's text on a real compiled run is the docs/layers.md ``compile`` sample
(rerun by tests/test_readme_samples.py); here the rule, the report's line and the dashboard's."""

from __future__ import annotations

from memscope.analysis.hotspots import Hotspot, compiled_note


def spot(module: str, type_: str, share: float) -> Hotspot:
    return Hotspot(module=module, type=type_, activation_bytes=int(share * 1000), share=share,
                   output_bytes=0, forward_s=0.0, calls=1)


def test_only_a_compiled_module_gets_the_note() -> None:
    assert compiled_note([spot("blocks.0", "Block", 0.6), spot("", "GPT", 0.4)]) == ""
    whole = compiled_note([spot("", "OptimizedModule", 1.0)])
    assert whole.startswith("(model) runs under torch.compile") and "one by one" in whole
    assert compiled_note([spot("body", "OptimizedModule", 0.6), spot("head", "Linear", 0.4)]).startswith("body ")
    two = compiled_note([spot("a", "OptimizedModule", 0.5), spot("b", "OptimizedModule", 0.5)])
    assert two.startswith("2 modules run under torch.compile: what their submodules save is their rows")


def test_the_dashboards_detail_line_says_it() -> None:
    from memscope_tui.views.layers import detail_text

    assert "runs under torch.compile" in detail_text(spot("", "OptimizedModule", 1.0)).plain
    assert "torch.compile" not in detail_text(spot("blocks.0", "Block", 1.0)).plain


def test_a_hostile_module_name_is_shown_inert_and_bounded() -> None:
    """The module name is the run file's (hostile): shown as every name is, escaped and cut."""
    from memscope.display import shown

    evil = "x\x1b[31m\u202e[bold]" + "A" * 5000
    note = compiled_note([spot(evil, "OptimizedModule", 1.0)], shown)
    assert "\x1b" not in note and "\u202e" not in note and len(note) < 600, note[:80]
    assert note.startswith(shown(evil) + " runs under torch.compile")
