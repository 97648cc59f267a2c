"""`ratchet audit show DIR`: a readable terminal timeline of a log (rich)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from audit.reader import payload_of, read_records

__all__ = ["show", "summarize_payload"]

_STYLE = {"allow": "green", "deny": "bold red", "ask": "yellow"}


def summarize_payload(kind: str, payload: dict[str, Any]) -> str:
    """One short line per record kind."""
    if kind == "checkpoint":
        return f"signed seq {payload.get('covers_seq')} key {str(payload.get('key_id', ''))[:12]}"
    if kind == "iteration.result":
        verdict = "ACCEPTED" if payload.get("accepted") else "rejected"
        ci = f"[{payload.get('ci_low')}, {payload.get('ci_high')}]"
        parity = "ok" if payload.get("parity_ok") else "FAIL"
        speedup = payload.get("speedup")
        return f"{verdict} speedup {speedup} CI {ci} parity {parity} {payload.get('reason', '')}"
    action = payload.get("action")
    if isinstance(action, dict):
        detail = (
            action.get("path") or action.get("argv") or action.get("host") or action.get("resource") or ""
        )
        return f"{action.get('kind')} {detail} — {payload.get('reason', '')}"
    text = json.dumps(payload, sort_keys=True)
    return text if len(text) <= 100 else text[:97] + "..."


def show(directory: Path, *, console: Console | None = None, last: int | None = None) -> int:
    """Print the timeline; return the number of records shown."""
    console = console or Console()
    records = read_records(directory)
    if last is not None:
        records = records[-last:]
    table = Table(title=f"audit log {directory}", show_lines=False, expand=True)
    for column in ("seq", "time", "it", "kind", "decision", "rule", "what"):
        table.add_column(
            column, overflow="fold", no_wrap=column != "what", ratio=4 if column == "what" else None
        )
    for record in records:
        decision = str(record.get("decision") or "")
        kind = str(record.get("kind"))
        table.add_row(
            str(record.get("seq")),
            str(record.get("ts", ""))[11:23],
            "" if record.get("iteration") is None else str(record.get("iteration")),
            kind,
            Text(decision, style=_STYLE.get(decision, "")),
            str(record.get("rule") or ""),
            summarize_payload(kind, payload_of(directory, record)),
        )
    console.print(table)
    return len(records)
