"""`ratchet claim`: does a published throughput fit the hardware it was measured on?

Model config + hardware (a datasheet by name, peaks given, or this host measured) + workload (input and output
lengths, concurrency; or every cell of a spec's grid) + the claimed tok/s -> the share of the peak it implies and a
plain verdict (harness/physics.py judge_claim). With `--results FILE` (a `ratchet measure --out` JSON) each measured
cell is checked the same way. Exit 0 when no claim is impossible, 1 when one is, 2 for a claim that cannot be
checked (its workload, throughput or hardware missing; a model the roofline cannot count).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from agent.commands._common import cli_errors, console, open_spec
from agent.commands._roofline import si
from agent.spec import CampaignSpec, SpecError
from harness.ceilings import DATASHEETS, Ceilings, named_ceilings, served_ceilings
from harness.config import BenchmarkConfig
from harness.errors import CeilingsUnavailable, RooflineUnavailable
from harness.physics import CLAIM_METRICS, ClaimVerdict, judge_claim, served_model, workload_of
from harness.roofline import Workload

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("claim", help="check a published tok/s claim against the hardware's roofline")
    p.add_argument("--spec", help="a campaign spec: its model and dtype, and its grid as the workload")
    p.add_argument("--model", help="a checkpoint directory or config.json (in place of --spec's)")
    p.add_argument("--dtype", help="the weights' dtype (default: the spec's, else bfloat16)")
    p.add_argument("--hardware", help=f"a GPU by name, with its datasheet peaks: {', '.join(DATASHEETS)}")
    p.add_argument("--peak-tflops", type=float, help="matmul peak at the dtype, TFLOP/s (with --bandwidth-gbs)")
    p.add_argument("--bandwidth-gbs", type=float, help="memory bandwidth, GB/s (with --peak-tflops)")
    p.add_argument("--cache-mib", type=float, default=0.0, help="on-chip cache with --peak-tflops (default 0)")
    p.add_argument("--measure-here", action="store_true", help="this host's ceilings, measured (needs --spec)")
    p.add_argument("--input-len", type=int, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, help="generated tokens per request")
    p.add_argument("--concurrency", type=int, help="requests in flight")
    p.add_argument("--num-prompts", type=int, help="requests (default: the concurrency)")
    p.add_argument("--tok-s", type=float, nargs="+", help="the claimed throughput(s)")
    p.add_argument("--metric", choices=CLAIM_METRICS, default="total",
                   help="what the tok/s counts: prompt + generated (total), generated, or prompt tokens")
    p.add_argument("--results", help="a `ratchet measure --out` JSON: each measured cell checked as a claim")
    p.add_argument("--out", help="also write the verdicts as JSON")
    p.set_defaults(func=run)


def missing(args: argparse.Namespace) -> list[str]:
    """What a claim lacks to be checked, each with the flag that gives it."""
    gaps = []
    if not args.spec and not args.model:
        gaps.append("the model: --model CONFIG (or --spec SPEC)")
    if not args.spec:
        lacking = [f"--{name.replace('_', '-')}" for name in ("input_len", "output_len", "concurrency")
                   if getattr(args, name) is None]
        if lacking:
            gaps.append(f"the workload: {', '.join(lacking)} (or --spec SPEC for its grid)")
    if not args.tok_s and not args.results:
        gaps.append("the claimed throughput: --tok-s X (or --results FILE.json)")
    if not (args.hardware or args.measure_here or (args.peak_tflops and args.bandwidth_gbs)):
        gaps.append("the hardware: --hardware NAME, --peak-tflops with --bandwidth-gbs, or --measure-here")
    if args.measure_here and not args.spec:
        gaps.append("--measure-here measures at a spec's dtype and threads: --spec SPEC")
    return gaps


def _ceilings(args: argparse.Namespace, spec: CampaignSpec | None, dtype: str) -> Ceilings:
    if args.measure_here:
        assert spec is not None
        return served_ceilings(spec.server, hardware=spec.hardware)
    if args.hardware:
        return named_ceilings(args.hardware, dtype=dtype)
    flop_s, bytes_s = args.peak_tflops * 1e12, args.bandwidth_gbs * 1e9
    return Ceilings(flop_s=flop_s, bytes_s=bytes_s, flop_s_best=flop_s, bytes_s_best=bytes_s,
                    cache_bytes=args.cache_mib * 2**20, dtype=dtype, source="given on the command line")


def _claims(args: argparse.Namespace, bench: BenchmarkConfig | None) -> list[tuple[str, Workload, float, str]]:
    """(label, workload, claimed tok/s, metric) for every claim to check."""
    if args.results:
        if bench is None:
            raise SpecError("--results needs the spec its grid was measured with: --spec SPEC")
        rows = json.loads(Path(args.results).read_text()).get("cells") or []
        cells = {c.label: c for c in bench.cells() if not c.has_images}
        out = []
        for row in rows:
            cell = cells.get(str(row.get("cell")))
            key = "prefill_tok_s" if cell is not None and cell.is_prefill else "total_token_throughput"
            if cell is not None and isinstance(row.get(key), int | float):
                out.append((cell.label, workload_of(cell, bench), float(row[key]),
                            "prefill" if cell.is_prefill else "total"))
        return out
    if args.input_len is not None:
        loads = [("workload", Workload(args.input_len, args.output_len, args.num_prompts or args.concurrency,
                                       args.concurrency))]
    else:
        assert bench is not None
        loads = [(c.label, workload_of(c, bench)) for c in bench.cells() if not c.has_images]
    return [(label, load, tok_s, args.metric) for tok_s in args.tok_s for label, load in loads]


def _table(verdicts: list[tuple[str, ClaimVerdict]], ceilings: Ceilings, model: str) -> Table:
    table = Table(title=f"{model} on {ceilings.summary()}", title_justify="left")
    for col in ("workload", "claimed", "in/out x requests @ concurrency", "seconds", "peak needed (served / least)",
                "verdict"):
        table.add_column(col, justify="right" if col in ("claimed", "seconds") else "left")
    for label, v in verdicts:
        load = v.load
        table.add_row(label, f"{v.tok_s:,.0f} {v.metric} tok/s",
                      f"{load.input_len}/{load.output_len} x {load.num_prompts} @ {load.concurrency}",
                      f"{v.seconds:.3g}", f"{v.need_served:.0%} / {v.need_min:.0%} ({v.bound})", v.text)
    return table


def _json(label: str, v: ClaimVerdict) -> dict[str, Any]:
    return {"workload": label, "tok_s": v.tok_s, "metric": v.metric, "load": vars(v.load), "seconds": v.seconds,
            "need_served": v.need_served, "need_min": v.need_min, "bound": v.bound, "verdict": v.verdict,
            "text": v.text}


@cli_errors
def run(args: argparse.Namespace) -> int:
    gaps = missing(args)
    if gaps:
        raise SpecError("a claim cannot be checked without " + "; ".join(gaps))
    spec = open_spec(args.spec) if args.spec else None
    model = Path(args.model) if args.model else spec.server.model   # type: ignore[union-attr]
    engine_args: dict[str, object] = dict(spec.server.engine_args) if spec else {}
    if args.dtype:
        engine_args["dtype"] = args.dtype
    served = served_model(model, engine_args)
    if served.shape is None:
        raise SpecError(served.omitted)
    dtype = str(engine_args.get("dtype") or "bfloat16")
    try:
        ceilings = _ceilings(args, spec, "bfloat16" if dtype == "auto" else dtype)
    except (CeilingsUnavailable, RooflineUnavailable) as exc:
        raise SpecError(str(exc)) from None
    verdicts = [(label, judge_claim(served.shape, load, ceilings, tok_s, metric=metric,
                                    weight_itemsize=served.weight_itemsize, kv_itemsize=served.kv_itemsize))
                for label, load, tok_s, metric in _claims(args, spec.benchmark if spec else None)]
    console.print(_table(verdicts, ceilings, f"{served.shape.architecture} ({model}, "
                                              f"{si(2 * served.shape.weights, 'FLOP')} per generated token)"))
    console.print("peak needed: the claimed rate's work over the peak; served = every layer on every prompt token "
                  "(vLLM's default), least = with the KV-shared layers skipped on prompt tokens (the floor)")
    if args.out:
        Path(args.out).write_text(json.dumps({"model": str(model), "ceilings": ceilings.to_json(),
                                              "claims": [_json(label, v) for label, v in verdicts]}, indent=1) + "\n")
    return 1 if any(v.verdict == "impossible" for _, v in verdicts) else 0
