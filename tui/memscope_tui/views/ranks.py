"""7 · Ranks: one line per rank of a distributed run."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from memscope.units import human_bytes
from memscope.display import shown
from memscope_tui.data import Snapshot
from memscope_tui.views import View, matches
from memscope_tui.widgets import RowTable, fill_table, plain, right

COLUMNS = [("rank", "rank"), ("host", "host"), ("proc", "proc"), ("steps", "steps"),
           ("peak", "peak"), ("at step", "peak_step"), ("status", "status")]


class RanksView(View):
    TITLE = "Ranks"

    def compose(self) -> ComposeResult:
        yield Static("", id="ranks-caption", classes="line")
        yield RowTable(id="rank-table", cursor_type="row", zebra_stripes=True)

    def show(self, snap: Snapshot, filter_text: str) -> None:
        self.snap, self.filter_text = snap, filter_text
        caption = self.query_one("#ranks-caption", Static)
        ranks = snap.ranks
        rows: list[tuple[str, list[Any]]] = []
        if len(ranks) < 2:
            caption.update(Text("a single process: no ranks to compare", style="dim"))
        else:
            imb = snap.imbalance
            caption.update(Text.assemble(f"{len(ranks)} ranks",
                                         "" if imb is None else f" · peak imbalance {imb:.0%}"))
            for r in ranks:
                if not matches(filter_text, r.rank, r.host, r.status):
                    continue
                status = Text(shown(r.status) + (" · OOM" if r.oom else ""),
                              style="bold red" if r.oom or r.status not in ("finished", "stopped", "ok")
                              else "")
                rows.append((f"{r.rank}|{r.proc}", [
                    right("-" if r.rank is None else str(r.rank)), plain(r.host or ""), right(str(r.proc)),
                    right(str(r.steps)),
                    right(human_bytes(r.peak_bytes)), right("-" if r.peak_step is None else str(r.peak_step)),
                    status]))
        fill_table(self.query_one("#rank-table", DataTable), COLUMNS, rows, self.drawn, "ranks")
