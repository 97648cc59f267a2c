"""`ratchet profile SPEC [--cell IN/OUT]`: top ops by self time for prefill and decode of one cell."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from rich.table import Table

from agent.commands._common import cli_errors, console, ensure_workspace, err_console, make_backend, open_spec
from harness.config import Cell
from harness.profiling import profile_cell

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("profile", help="where the time goes for one cell (torch profiler, self time)")
    p.add_argument("spec")
    p.add_argument("--cell", help="INPUT/OUTPUT lengths, e.g. 512/64 (default: the grid's largest cell)")
    p.add_argument("--workspace")
    p.add_argument("--out", help="write the profile as JSON")
    p.set_defaults(func=run)


def _parse_cell(text: str) -> Cell:
    try:
        i, o = text.split("/")
        return Cell(input_len=int(i), output_len=int(o))
    except ValueError as exc:
        raise SystemExit(f"error: --cell expects INPUT/OUTPUT such as 512/64, got {text!r}") from exc


@cli_errors
def run(args: argparse.Namespace) -> int:
    spec = open_spec(args.spec)
    cell = _parse_cell(args.cell) if args.cell else max(
        (c for c in spec.benchmark.cells() if not c.is_prefill and not c.has_images),
        key=lambda c: (c.input_len, c.output_len))
    ws = ensure_workspace(spec, workspace=args.workspace)
    work = ws.root.parent / f"{ws.root.name}.runs" / f"profile-{time.strftime('%Y%m%d-%H%M%S')}"
    err_console.print(f"profiling {cell.label} of {ws.root} @ {ws.head()[:10]}")
    profiles = profile_cell(make_backend(spec), tree=ws.root, engine_args=ws.serving_config(), server=spec.server,
                            bench=spec.benchmark, cell=cell, work_dir=work,
                            cache_dir=ws.root.parent / ".cache" / ws.content_hash())
    for prof in profiles:
        table = Table(title=f"{prof.phase}: {prof.cell.label}, top ops by self time", title_justify="left")
        for col in ("op", "kind", "self ms", "calls", "share"):
            table.add_column(col, justify="left" if col in ("op", "kind") else "right")
        for op in prof.ops:
            table.add_row(op.name[:70], op.category, f"{op.self_ms:.1f}", str(op.calls), f"{op.share:.1%}")
        console.print(table)
    if args.out:
        # the cell by its label, as everywhere else (compare's samples, the log): in64/out1
        rows = [{**asdict(p), "cell": p.cell.label} for p in profiles]
        Path(args.out).write_text(json.dumps(rows, indent=1, default=str) + "\n")
    return 0
