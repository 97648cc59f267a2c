"""`ratchet compare SPEC --baseline REF --candidate REF`: the seed claim's verification recipe.

Two builds on the same machine with the same engine args recorded for both, token parity checked, the
grid measured interleaved, and a relative table per cell with bootstrap CIs. A REF is a git ref of the
workspace, a path to a tree holding vllm/, or a patch file (applied on top of the workspace's HEAD).
Exit 0 when parity holds, 1 when parity is broken.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from agent.campaign import check_parity_coverage
from agent.commands._common import cli_errors, console, ensure_workspace, err_console, make_backend, open_spec
from agent.commands._render import ab_table, progress_bar
from agent.commands._roofline import ROOFLINE_NOTE, host_ceilings, roofline_table, served_of
from agent.replay import reduced_grid
from agent.spec import CampaignSpec, SpecError
from harness.ceilings import Ceilings
from harness.config import BenchmarkConfig
from harness.measure import ABResult, Build, ab_compare
from harness.physics import roofline_rows
from harness.stats import check_repeats
from sandbox.errors import WorkspaceError
from sandbox.workspace import Workspace

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("compare", help="A/B two builds: parity + interleaved grid with CIs")
    p.add_argument("spec")
    p.add_argument("--baseline", default="HEAD", help="git ref, tree path, or .patch/.diff file")
    p.add_argument("--candidate", required=True, help="git ref, tree path, or .patch/.diff file")
    p.add_argument("--workspace")
    p.add_argument("--repeats", type=int, help="override benchmark.repeats (pairs per cell)")
    p.add_argument("--cells", help="only these cells, e.g. in512/out64,in512/out1 (default: the spec's grid)")
    p.add_argument("--engine-args", help="JSON object overriding the candidate's engine args")
    p.add_argument("--out", help="write the comparison as JSON")
    p.set_defaults(func=run)


def _build(ws: Workspace, ref: str, tag: str, work: Path) -> Build:
    path = Path(ref)
    if path.suffix in (".patch", ".diff") and path.is_file():
        tree = ws.checkout_copy("HEAD", work / f"tree-{tag}")
        copy = Workspace.open(tree, ws.package)
        copy.apply_patch(path.read_text())
        return Build(tag=tag, tree=tree, engine_args=copy.serving_config(), ref=f"HEAD+{path.name}")
    if path.is_dir() and (path / ws.package).is_dir():
        serving = Workspace(root=path.resolve(), package=ws.package)
        engine = serving.serving_config() if (path / "serving.yaml").exists() else ws.serving_config()
        return Build(tag=tag, tree=path.resolve(), engine_args=engine, ref=str(path.resolve()))
    try:
        commit = ws.resolve(ref)
    except WorkspaceError as exc:
        raise WorkspaceError(f"{ref!r} is neither a git ref of {ws.root}, a tree with {ws.package}/, "
                             "nor a .patch/.diff file") from exc
    tree = ws.checkout_copy(commit, work / f"tree-{tag}")
    return Build(tag=tag, tree=tree, engine_args=ws.serving_config(commit), ref=commit)


def _roofline(spec: CampaignSpec, result: ABResult, bench: BenchmarkConfig, ceilings: Ceilings | None,
              no_ceilings: str) -> dict[str, object]:
    """Each build's cells on this host's roofline, printed; the JSON of it. A cell of B faster than its floor is
    what a campaign quarantines as impossible (harness/stats.py decide)."""
    out: dict[str, object] = {"ceilings": ceilings.to_json() if ceilings else {"omitted": no_ceilings}}
    for tag, grid in (("A", result.a), ("B", result.b)):
        rows = roofline_rows(grid.table(bench.cells()), served_of(spec, grid.build.engine_args), ceilings, bench)
        console.print(roofline_table(rows, f"{tag} on the roofline: "
                                           + (ceilings.summary() if ceilings else f"no ceilings ({no_ceilings})")))
        out[tag] = {str(row["cell"]): row.get("roofline") for row in rows}
        impossible = [cell for cell, rf in out[tag].items() if isinstance(rf, dict) and rf.get("impossible")]
        if impossible:
            console.print(f"[bold red]{tag}: cells {', '.join(impossible)} ran faster than this host's roofline "
                          "allows: impossible (tokens skipped or miscounted); a campaign quarantines such a "
                          "candidate[/bold red]")
    console.print(ROOFLINE_NOTE)
    return out


@cli_errors
def run(args: argparse.Namespace) -> int:
    spec = open_spec(args.spec)
    bench = spec.benchmark.model_copy(update={"repeats": args.repeats}) if args.repeats else spec.benchmark
    if args.cells:
        bench = reduced_grid(bench, [c.strip() for c in args.cells.split(",")], bench.repeats)
    try:
        check_repeats(bench.repeats)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    check_parity_coverage(spec)
    ws = ensure_workspace(spec, workspace=args.workspace)
    work = ws.root.parent / f"{ws.root.name}.runs" / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    a = _build(ws, args.baseline, "A", work)
    b = _build(ws, args.candidate, "B", work)
    if args.engine_args:
        b = Build(tag=b.tag, tree=b.tree, engine_args={**b.engine_args, **json.loads(args.engine_args)}, ref=b.ref)
    err_console.print(f"A = {a.ref} {a.engine_args}\nB = {b.ref} {b.engine_args}")
    ceilings, no_ceilings = host_ceilings(spec)     # before any server: the host idle
    started = time.monotonic()
    cells = bench.cells()
    with progress_bar(len(cells) * bench.repeats * 2, "interleaved runs") as (bar, task):
        result = ab_compare(make_backend(spec), a, b, server=spec.server, bench=bench, stats_cfg=spec.stats,
                            parity=spec.parity, work_dir=work, cache_dir=ws.root.parent / ".cache" / "compare",
                            progress=lambda msg: err_console.print(msg),
                            on_run=lambda run: bar.advance(task))  # type: ignore[arg-type]
    wall = time.monotonic() - started
    console.print(ab_table(result, f"{spec.name}: B vs A, {bench.repeats} interleaved pairs per cell, "
                                   f"wall {wall:.0f} s "
                                   f"(ratios > 1: B better)"))
    parity_line = result.parity.summary() if result.parity else "parity not checked"
    console.print(parity_line)
    roofline = _roofline(spec, result, bench, ceilings, no_ceilings)
    if args.out:
        out = {"spec": spec.name, "a": {"ref": a.ref, "engine_args": a.engine_args, "startup_s": result.a.startup_s,
                                        "evidence": result.a.evidence},
               "b": {"ref": b.ref, "engine_args": b.engine_args, "startup_s": result.b.startup_s,
                     "evidence": result.b.evidence},
               "repeats": bench.repeats, "wall_s": wall, "overall": vars(result.overall) if result.overall else None,
               "images": vars(result.images) if result.images else None,
               "cells": {label: {m: vars(ci) for m, ci in per.items()} for label, per in result.cells.items()},
               "samples": {tag: [{"cell": r.job.cell.label, "repeat": r.job.repeat, **r.metrics()} for r in g.runs]
                           for tag, g in (("A", result.a), ("B", result.b))},
               "parity": result.parity.to_json() if result.parity else None, "roofline": roofline}
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        err_console.print(f"wrote {args.out}")
    for tag in ("A", "B"):
        if (work / f"tree-{tag}").exists():
            ws.remove_copy(work / f"tree-{tag}")
    return 0 if result.parity is None or result.parity.ok else 1
