"""`ratchet parity SPEC --reference FILE.json`: greedy tokens of the current workspace vs a reference.

`--record FILE.json` writes a reference instead (from the current workspace). Exit 0 when every held
prompt matches exactly, 1 when parity is broken, 2/3 on bad input / harness failure.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from agent.commands._common import cli_errors, console, ensure_workspace, err_console, make_backend, open_spec
from harness.measure import Build, parity_server
from harness.parity import compare, generate, held_generations, load_prompts, load_reference, save_reference
from harness.server import serve

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("parity", help="check token parity of the current workspace against a reference")
    p.add_argument("spec")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--reference", help="recorded reference JSON to compare against")
    group.add_argument("--record", help="record a reference from the current workspace to this file")
    p.add_argument("--workspace", help="workspace directory (default: .ratchet/workspaces/<spec name>)")
    p.add_argument("--batch-of-one", action="store_true", help="send prompts one at a time (default: all at once)")
    p.add_argument("--report", help="write the per-prompt verdicts as JSON")
    p.set_defaults(func=run)


@cli_errors
def run(args: argparse.Namespace) -> int:
    spec = open_spec(args.spec)
    prompts = load_prompts(spec.parity.prompts)
    reference = load_reference(Path(args.reference), prompts_path=spec.parity.prompts) if args.reference else None
    ws = ensure_workspace(spec, workspace=args.workspace)
    work = ws.root.parent / f"{ws.root.name}.runs" / f"parity-{time.strftime('%Y%m%d-%H%M%S')}"
    cache_dir = ws.root.parent / ".cache" / ws.content_hash()
    if spec.parity.model is not None:   # dummy speed weights: parity runs on the real checkpoint
        err_console.print(f"starting a server on {spec.parity.model} for {ws.root} @ {ws.head()[:10]}")
        build = Build(tag="workspace", tree=ws.root, engine_args=ws.serving_config(), ref=ws.head())
        server = parity_server(make_backend(spec), build, server=spec.server, parity=spec.parity, work_dir=work,
                               cache_dir=cache_dir / "parity")
    else:
        err_console.print(f"starting server for {ws.root} @ {ws.head()[:10]}")
        server = serve(make_backend(spec), tree=ws.root, config=spec.server, engine_args=ws.serving_config(),
                       log_path=work / "server.log", cache_dir=cache_dir)
    with server as srv:
        err_console.print(f"server ready in {srv.startup_s:.1f} s; generating {len(prompts)} prompts")
        generations = (generate(srv.base_url, srv.model_name, prompts, spec.parity, concurrency=1)
                       if args.batch_of_one else held_generations(srv.base_url, srv.model_name, prompts, spec.parity,
                                                                  concurrency=spec.benchmark.max_concurrency))
    if reference is None:
        save_reference(Path(args.record), generations, prompts_path=spec.parity.prompts,
                       meta={"ref": ws.head(), "tree": ws.content_hash(), "engine_args": ws.serving_config(),
                             "evidence": srv.evidence})
        console.print(f"recorded {len(generations)} generations to {args.record}")
        return 0
    report = compare(reference, generations, logprob_tolerance=spec.parity.logprob_tolerance, prompts=prompts)
    if args.report:
        Path(args.report).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    console.print(report.summary())
    for verdict in report.mismatches[:10]:
        console.print(f"  {verdict.prompt_id}: first divergence at token {verdict.first_divergence} "
                      f"({verdict.reference_token} -> {verdict.candidate_token}), reference margin "
                      f"{verdict.reference_margin}")
    return 0 if report.ok else 1
