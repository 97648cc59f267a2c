"""The served roofline as the measurement commands show it: this host's ceilings, measured once before any server
starts, and a table of each cell's work, floor and what the measurement reached of it (harness/physics.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from agent.campaign import host_ceilings as campaign_ceilings
from agent.commands._common import err_console
from agent.measurements import HARNESS
from agent.spec import CampaignSpec
from harness.ceilings import Ceilings
from harness.physics import ServedModel, served_model

__all__ = ["host_ceilings", "served_of", "roofline_table", "si", "ROOFLINE_NOTE"]

ROOFLINE_NOTE = ("roofline: floor = max(least FLOPs / matmul rate, bytes / bandwidth) at this host's measured "
                 "ceilings; MFU counts the FLOPs vLLM runs by default; 'impossible' = faster than the floor at the "
                 "fastest ceiling sample (harness/physics.py)")


def host_ceilings(spec: CampaignSpec) -> tuple[Ceilings | None, str]:
    """(ceilings, "") or (None, why not), as a campaign measures them: a host that cannot still measures its grid."""
    ceilings, why = campaign_ceilings(spec, HARNESS, lambda kind, data: err_console.print(
        data.get("phase") or data.get("message"), highlight=False))
    if ceilings is not None:
        err_console.print(f"ceilings: {ceilings.summary()}", highlight=False)
    return ceilings, why


def served_of(spec: CampaignSpec, engine_args: Mapping[str, object]) -> ServedModel:
    return served_model(spec.server.model, {**spec.server.engine_args, **engine_args})


def si(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:,.1f} {prefix}{unit}"
    return f"{value:,.0f} {unit}"


def _pct(value: object) -> str:
    return f"{value:.1%}" if isinstance(value, int | float) else "-"


def roofline_table(rows: Sequence[Mapping[str, Any]], title: str) -> Table:
    """One row per cell of rows carrying a "roofline" column (harness.physics.roofline_rows)."""
    table = Table(title=title, title_justify="left")
    for col in ("cell", "FLOPs served / least", "bytes", "floor s", "bound", "measured s", "MFU", "MBU",
                "of roofline", "physics"):
        table.add_column(col, justify="left" if col in ("cell", "bound", "physics") else "right")
    for row in rows:
        rf = row.get("roofline") or {}
        if "omitted" in rf:
            table.add_row(str(row.get("cell")), *["-"] * 8, f"omitted: {rf['omitted']}")
            continue
        measured = isinstance(rf.get("measured_s"), int | float)
        table.add_row(str(row.get("cell")), f"{si(rf['flops'], 'FLOP')} / {si(rf['min_flops'], 'FLOP')}",
                      si(rf["bytes"], "B"), f"{rf['floor_s']:.3g}" if measured else "-", str(rf.get("bound", "-")),
                      f"{rf['measured_s']:.3g}" if measured else "-", _pct(rf.get("mfu")), _pct(rf.get("mbu")),
                      _pct(rf.get("roofline")),
                      ("IMPOSSIBLE" if rf.get("impossible") else "ok") if measured else "no ceilings")
    return table
