"""`ratchet profile SPEC [--cell IN/OUT] [--traces DIR]`: where the time goes for prefill and decode of one cell:
the median engine step per phase (GPU busy vs idle, kernel time by category) and the top ops by self time."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from rich.table import Table

from agent.commands._common import cli_errors, console, ensure_workspace, err_console, make_backend, open_spec
from agent.spec import SpecError
from harness.config import Cell
from harness.profiling import Profile, model_hints, profile_cell, read_profile

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("profile", help="where the time goes for one cell: the median engine step (GPU busy vs "
                                       "idle, kernels by category) and the top ops by self time (torch profiler)")
    p.add_argument("spec")
    p.add_argument("--cell", help="INPUT/OUTPUT lengths, e.g. 512/64 (default: the grid's largest cell)")
    p.add_argument("--workspace")
    p.add_argument("--out", help="write the profile as JSON")
    p.add_argument("--traces", help="read the traces of an earlier profile (its folder, holding trace-prefill/ and "
                                    "trace-end-to-end/) instead of starting a server")
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
    if args.traces:
        profiles = _from_traces(Path(args.traces), cell, spec.server.model)
    else:
        ws = ensure_workspace(spec, workspace=args.workspace)
        work = ws.root.parent / f"{ws.root.name}.runs" / f"profile-{time.strftime('%Y%m%d-%H%M%S')}"
        err_console.print(f"profiling {cell.label} of {ws.root} @ {ws.head()[:10]}")
        profiles = profile_cell(make_backend(spec), tree=ws.root, engine_args=ws.serving_config(),
                                server=spec.server, bench=spec.benchmark, cell=cell, work_dir=work,
                                cache_dir=ws.root.parent / ".cache" / ws.content_hash())
    for prof in profiles:
        _print_steps(prof)
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


def _from_traces(folder: Path, cell: Cell, model: Path) -> list[Profile]:
    """An earlier profile's phases (trace-<phase>/ folders), or one folder of traces read as end-to-end."""
    if not folder.is_dir():
        raise SpecError(f"--traces {folder}: not a folder; pass the profile-… folder that holds trace-end-to-end/")
    hints, why = model_hints(model)
    phases = sorted((p for p in folder.iterdir() if p.is_dir() and p.name.startswith("trace-")),
                    key=lambda p: p.name != "trace-prefill")
    if not phases:
        return [read_profile("end-to-end", cell, folder, hints, why=why)]
    return [read_profile(p.name.removeprefix("trace-"), Cell(input_len=cell.input_len, output_len=1)
                         if p.name == "trace-prefill" else cell, p, hints, why=why) for p in phases]


def _print_steps(prof: Profile) -> None:
    if prof.steps is None:
        console.print(f"{prof.phase} run ({prof.cell.label}): no step table: {prof.steps_note}", highlight=False)
        return
    steps = prof.steps
    for phase in steps.phases:
        batch = f", {phase.requests[0]}..{phase.requests[2]} requests per step" if phase.requests else ""
        table = Table(title=f"{prof.phase} run ({prof.cell.label}): {phase.phase} steps, median per step "
                            f"over {phase.steps} steps{batch}", title_justify="left")
        for col in ("row", "median µs", "share of wall"):
            table.add_column(col, justify="left" if col == "row" else "right")
        for row in phase.rows:
            table.add_row(row.name, f"{row.median_us:.1f}", f"{row.share:.1%}")
        console.print(table)
    console.print(f"steps from {steps.source}; {steps.device}", highlight=False)
    for note in steps.notes:
        console.print(f"  note: {note}", highlight=False)
