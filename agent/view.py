"""The main job's live view: iteration, hypothesis, phase, outcomes so far, budget left; and the final
table. On a terminal it is a rich Live panel; piped (CI logs) it prints one line per event."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agent.base import HistoryEntry

__all__ = ["CampaignView", "final_table"]


class CampaignView:
    def __init__(self, console: Console, *, max_iterations: int, title: str) -> None:
        self.console = console
        self.max_iterations = max_iterations
        self.title = title
        self.iteration = 0
        self.phase = "starting"
        self.hypothesis = ""
        self.message = ""
        self.runs = 0
        self.history: list[HistoryEntry] = []
        self.started = time.monotonic()
        self._live: Live | None = None

    def __enter__(self) -> CampaignView:
        if self.console.is_terminal:
            self._live = Live(self._render(), console=self.console, refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live:
            self._live.update(self._render())
            self._live.__exit__(None, None, None)

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "iteration":
            self.iteration, self.hypothesis, self.runs = int(data["iteration"]), "", 0
        elif kind == "phase":
            self.phase = str(data["phase"])
        elif kind == "hypothesis":
            self.hypothesis = str(data["text"])
        elif kind == "progress":
            self.message = str(data["message"])
        elif kind == "run":
            self.runs += 1
        elif kind == "result":
            self.history.append(data["entry"])
        if self._live:
            self._live.update(self._render())
        elif kind != "run":
            line = {"iteration": f"== iteration {self.iteration}/{self.max_iterations}",
                    "phase": f"   phase: {self.phase}",
                    "hypothesis": f"   hypothesis: {self.hypothesis[:160]}", "progress": f"   {self.message}"}.get(kind)
            if kind == "result":
                entry: HistoryEntry = data["entry"]
                line = f"   -> {entry.outcome}: {entry.speedup or ''} {entry.detail[:160]}"
            if line:
                print(line, file=sys.stderr, flush=True)

    def _render(self) -> Panel:
        elapsed = time.monotonic() - self.started
        head = Text(f"iteration {self.iteration}/{self.max_iterations}   phase: {self.phase}   "
                    f"benchmark runs this iteration: {self.runs}   elapsed {elapsed:.0f} s")
        table = Table(expand=True, show_edge=False)
        for col in ("#", "outcome", "speedup [CI]", "hypothesis / reason"):
            table.add_column(col)
        for h in self.history[-8:]:
            table.add_row(str(h.iteration), h.outcome, h.speedup or "-", (h.hypothesis or h.detail)[:100])
        return Panel(Group(head, Text(f"hypothesis: {self.hypothesis[:200]}"), Text(self.message[:200]), table),
                     title=self.title)


def final_table(baseline_rows: list[dict[str, Any]], cells: dict[str, dict[str, Any]] | None,
                parity_ok: bool | None, *, empty: str = "no accepted change") -> Table:
    table = Table(title="best vs baseline (stock engine args), per cell", title_justify="left")
    for col in ("cell", "metric", "baseline", "speedup [95% CI]", "parity"):
        table.add_column(col, justify="left" if col in ("cell", "metric") else "right")
    for row in baseline_rows:
        label = str(row["cell"])
        prefill = row.get("output_len") == 1
        metric = "prefill_tok_s" if prefill else "total_token_throughput"
        ci = (cells or {}).get(label, {}).get("headline")
        table.add_row(label, "prefill tok/s" if prefill else "total tok/s", f"{row.get(metric, 0):,.0f}",
                      ci if isinstance(ci, str) else (str(ci) if ci else empty),
                      "-" if parity_ok is None else ("identical" if parity_ok else "BROKEN"))
    return table
