"""`ratchet measure SPEC [--out FILE.json]`: the baseline grid of the current workspace."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from agent.commands._common import cli_errors, console, ensure_workspace, err_console, make_backend, open_spec
from agent.commands._render import grid_table, progress_bar
from agent.commands._roofline import ROOFLINE_NOTE, host_ceilings, roofline_table, served_of
from harness.measure import Build, measure_grid
from harness.physics import roofline_rows

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("measure", help="measure the benchmark grid of the current workspace")
    p.add_argument("spec", help="campaign spec, e.g. experiments/gemma4-tiny-cpu.yaml")
    p.add_argument("--out", help="also write the result as JSON (one object per cell)")
    p.add_argument("--workspace", help="workspace directory (default: .ratchet/workspaces/<spec name>)")
    p.add_argument("--repeats", type=int, help="override benchmark.repeats")
    p.set_defaults(func=run)


@cli_errors
def run(args: argparse.Namespace) -> int:
    spec = open_spec(args.spec)
    bench = spec.benchmark.model_copy(update={"repeats": args.repeats}) if args.repeats else spec.benchmark
    ws = ensure_workspace(spec, workspace=args.workspace)
    build = Build(tag="baseline", tree=ws.root, engine_args=ws.serving_config(), ref=ws.head())
    work = ws.root.parent / f"{ws.root.name}.runs" / f"measure-{time.strftime('%Y%m%d-%H%M%S')}"
    ceilings, no_ceilings = host_ceilings(spec)     # before any server: the host idle
    started = time.monotonic()
    cells = bench.cells()
    with progress_bar(len(cells) * bench.repeats, "benchmark runs") as (bar, task):
        result = measure_grid(make_backend(spec), build, server=spec.server, bench=bench, work_dir=work,
                              cache_dir=ws.root.parent / ".cache" / ws.content_hash(),
                              progress=lambda msg: err_console.print(msg),
                              on_run=lambda run: bar.advance(task))  # type: ignore[arg-type]
    wall = time.monotonic() - started
    served = served_of(spec, build.engine_args)
    rows = roofline_rows(result.table(cells), served, ceilings, bench)
    console.print(grid_table(rows, f"{spec.name} @ {build.ref[:10]}  (median of {bench.repeats}; "
                                   f"server start {result.startup_s:.1f} s; wall {wall:.0f} s)"))
    console.print("prefill tok/s = input tokens / wall time of an output-length-1 run (measured, not derived)")
    image_rows = [r for r in rows if "image_tokens_per_request" in r]
    if image_rows:
        counts = "; ".join(f"{r['cell']}: {r['input_len']} text + {r['image_tokens_per_request']:.0f} image"
                           for r in image_rows)
        console.print(f"image cells (img<pictures>x<px>): input tokens per request as the server counted them, text + "
                      f"image tokens ({counts}); their tok/s and prefill tok/s count both, and a comparison judges "
                      "them apart from the text cells")
    console.print(roofline_table(rows, f"roofline of {spec.name}: "
                                       + (ceilings.summary() if ceilings else f"no ceilings ({no_ceilings})")))
    console.print(ROOFLINE_NOTE)
    if args.out:
        out = {"spec": spec.name, "ref": build.ref, "tree": ws.content_hash(), "engine_args": build.engine_args,
               "startup_s": result.startup_s, "wall_s": wall, "evidence": result.evidence,
               "isolation": result.evidence.get("isolation"), "repeats": bench.repeats, "cells": rows,
               "ceilings": ceilings.to_json() if ceilings else {"omitted": no_ceilings},
               "roofline_model": served.shape.architecture if served.shape else {"omitted": served.omitted},
               "prompts": {c.label: bench.prompts_for(c) for c in cells}, "max_concurrency": bench.max_concurrency}
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
        err_console.print(f"wrote {args.out}")
    return 0
