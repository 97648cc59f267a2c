"""The report's plots, drawn with matplotlib (object API, no pyplot state) as SVG text to inline in one HTML file.

Text stays text (`svg.fonttype: none`: searchable, small) and the output is deterministic (fixed hash salt, no
date), so two reports of one log are byte-identical.
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Callable, Sequence
from typing import ParamSpec

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from audit.facts import CellInterval, IterationFacts, Ratio

__all__ = ["decisions_plot", "forest_plot", "iterations_plot"]

P = ParamSpec("P")

GREEN, RED, GREY, BLUE = "#2e7d32", "#c62828", "#757575", "#1565c0"
_TIMES = FuncFormatter(lambda v, _: f"{v:.2f}×")


def _styled(draw: Callable[P, Figure]) -> Callable[P, str]:
    """Draw under the report's style (fonts are resolved when text is created, so the whole drawing is inside)."""
    @functools.wraps(draw)
    def svg(*args: P.args, **kwargs: P.kwargs) -> str:
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "ratchet", "font.size": 9,
                                    "font.family": "sans-serif"}):
            return _svg(draw(*args, **kwargs))
    return svg


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # drop the XML prolog: the SVG sits inside HTML
    # and the RDF metadata block (namespace URLs of its own, nothing a reader sees)
    return re.sub(r"\s*<metadata>.*?</metadata>", "", text, count=1, flags=re.S)


@_styled
def forest_plot(title: str, cells: Sequence[CellInterval], overall: Ratio | None, *,
                accept_lower_bound: float | None = None) -> Figure:
    """One row per cell (speedup and interval) and the overall geo-mean at the bottom, against 1.0×."""
    rows = [(c.cell, c.speedup, BLUE) for c in cells]
    if overall is not None:
        color = GREEN if overall.low > 1.0 else RED if overall.high < 1.0 else GREY
        rows.append(("overall (geo-mean)", overall, color))
    fig = Figure(figsize=(6.4, 0.32 * len(rows) + 1.0))
    ax = fig.add_subplot()
    for y, (_, r, color) in enumerate(reversed(rows)):
        ax.errorbar(r.ratio, y, xerr=[[r.ratio - r.low], [r.high - r.ratio]], fmt="o", color=color, capsize=3, ms=4)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in reversed(rows)])
    ax.axvline(1.0, color="#444", lw=0.8)
    if accept_lower_bound is not None:
        ax.axvline(accept_lower_bound, color=GREEN, lw=0.8, ls="--", label=f"accept bound {accept_lower_bound:g}×")
        ax.legend(loc="lower right", fontsize=8, frameon=False)
    ax.xaxis.set_major_formatter(_TIMES)
    ax.set_title(title, loc="left", fontsize=10)
    ax.grid(axis="x", color="#ddd", lw=0.5)
    return fig


@_styled
def iterations_plot(iterations: Sequence[IterationFacts]) -> Figure:
    """Each iteration's speedup vs its incumbent with the interval of its deciding A/B."""
    fig = Figure(figsize=(6.4, 2.6))
    ax = fig.add_subplot()
    for it in iterations:
        r = it.overall or it.screen
        if r is None:
            continue
        color = GREEN if it.accepted else RED if it.parity_broken else GREY
        ax.errorbar(it.iteration, r.ratio, yerr=[[r.ratio - r.low], [r.high - r.ratio]], fmt="o", color=color,
                    capsize=3, ms=4)
    ax.axhline(1.0, color="#444", lw=0.8)
    ax.yaxis.set_major_formatter(_TIMES)
    ax.set_xlabel("iteration")
    ax.set_xticks([it.iteration for it in iterations])
    ax.set_title("Speedup vs incumbent per iteration (green accepted, red parity failed, grey rejected)",
                 loc="left", fontsize=10)
    ax.grid(axis="y", color="#ddd", lw=0.5)
    return fig


@_styled
def decisions_plot(decisions: Sequence[tuple[str, str, int]]) -> Figure:
    colors = {"allow": GREEN, "deny": RED, "ask": "#f9a825"}
    fig = Figure(figsize=(6.4, 0.28 * len(decisions) + 0.9))
    ax = fig.add_subplot()
    labels = [f"{rule} ({decision})" for rule, decision, _ in decisions]
    ax.barh(range(len(decisions)), [n for _, _, n in decisions],
            color=[colors.get(d, GREY) for _, d, _ in decisions])
    ax.set_yticks(range(len(decisions)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("actions")
    ax.set_title("Gate decisions by rule", loc="left", fontsize=10)
    return fig
