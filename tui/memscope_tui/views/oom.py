"""6 · OOM: the post-mortem when the run ran out of memory (or was killed)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from memscope.units import human_bytes
from memscope_tui.data import Snapshot
from memscope_tui.views import View


class OomView(View):
    TITLE = "OOM"

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("", id="oom-body")

    def show(self, snap: Snapshot, filter_text: str) -> None:
        box = self.query_one("#oom-body", Static)
        r = snap.summary.oom
        if r is None:
            box.update(Text("no out-of-memory error in this run" +
                            (" (so far)" if snap.summary.status == "running" else ""), style="green"))
            return
        out = Text()
        title = "OUT OF MEMORY" if r.kind == "oom" else "KILLED"
        out.append(title, style="bold red")
        out.append(f" at step {r.step if r.step is not None else '?'}")
        if r.phase:
            out.append(f", {r.phase}")
        if r.module:
            out.append(" in module ")
            out.append(r.module, style="bold")
        out.append("\n\n")
        if r.requested_bytes is not None:
            out.append(f"requested  {human_bytes(r.requested_bytes)} ({r.requested_bytes} bytes)\n")
        if r.live_bytes is not None:
            out.append(f"live       {human_bytes(r.live_bytes)}\n")
        out.append(f"message    {r.message.strip().splitlines()[-1] if r.message.strip() else '-'}\n")
        if r.others:
            out.append(f"           and {r.others} more out-of-memory errors after it\n")
        if snap.oom_advice:
            out.append("\nwhat to change\n", style="bold")
            for line in snap.oom_advice:
                out.append(f"  • {line}\n")
        box.update(out)
