"""`ratchet run SPEC [--proposer search|llm] [--max-iterations N] [--search-strategy random|ordered|grid]`: a campaign.

Exit codes: 0 the campaign ran to a budget or the proposer's end, and whatever it accepted its final
best-vs-stock comparison bears out (lower bound above 1.0, parity); 2 bad input; 3 the baseline could not
be measured (server, benchmark, sandbox); 4 the audit log could not be written; 5 changes were accepted but
the final comparison does not show the branch to be better than stock (or could not run).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError

from agent.base import Proposer
from agent.campaign import CampaignEnd, start_campaign
from agent.commands._common import cli_errors, console, err_console, make_backend, open_spec
from agent.spec import BudgetConfig, CampaignSpec, ExecutorConfig, SpecError
from agent.view import CampaignView, final_table
from audit import AuditError

__all__ = ["register", "make_proposer", "print_end"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="run an optimization campaign (the main job)")
    p.add_argument("spec")
    p.add_argument("--proposer", choices=("search", "llm", "patches"), help="default: the spec's proposer.kind")
    p.add_argument("--max-iterations", type=int, help="override budget.max_iterations")
    p.add_argument("--wall-seconds", type=float,
                   help="override budget.wall_seconds (e.g. what a fixed budget of GPU time has left)")
    p.add_argument("--search-strategy", choices=("random", "ordered", "grid"), help="override proposer.search.strategy")
    p.add_argument("--executor", choices=("local", "ray"), help="override executor.kind")
    p.add_argument("--slots", type=int, help="override executor.slots (candidates per round: screened "
                   "together on this host with local, in flight at once with ray)")
    p.add_argument("--ray-address", help="override executor.ray.address (default: a local Ray for this run)")
    p.add_argument("--log-dir", default="audit_logs", help="campaign logs go to DIR/<campaign-id>/")
    p.add_argument("--workspaces", default=".ratchet/workspaces", help="where campaign workspaces are created")
    p.add_argument("--llm-base-url", help="OpenAI-compatible endpoint for --proposer llm")
    p.add_argument("--llm-model", help="model name for --proposer llm")
    p.set_defaults(func=run)


def make_proposer(spec: CampaignSpec, kind: str, *, base_url: str | None = None, model: str | None = None) -> Proposer:
    if kind == "search":
        from agent.proposers.search import SearchProposer

        return SearchProposer(spec.proposer.search)
    if kind == "patches":
        from agent.proposers.patch_files import PatchFilesProposer

        if not spec.proposer.patches:
            raise SpecError("proposer kind patches: the spec lists no proposer.patches")
        return PatchFilesProposer(spec.proposer.patches)
    from agent.proposers.llm import LLMConfig, LLMProposer  # type: ignore[import-not-found]

    settings = spec.proposer.llm.model_dump(exclude_none=True)
    if base_url:
        settings["base_url"] = base_url
    if model:
        settings["model"] = model
    return LLMProposer(LLMConfig(**settings))  # type: ignore[no-any-return]


def print_end(end: CampaignEnd) -> None:
    final = end.final
    cells = {label: {"headline": str(per["headline"])} for label, per in final.cells.items()} if final else None
    empty = "no accepted change" if not end.accepted else "final comparison did not run"
    console.print(final_table(end.baseline_rows, cells, final.parity.ok if final and final.parity else None,
                              empty=empty))
    if final and final.overall and final.images:
        console.print(f"text cells (geo-mean): {final.overall}; image cells (geo-mean): {final.images}")
    elif final and final.overall:
        console.print(f"overall (geo-mean over cells): {final.overall}")
    style = "green" if end.verdict.status == "improved" else ("red bold" if not end.verdict.ok else "")
    console.print(f"[{style}]verdict:  {end.verdict.status}: {end.verdict.text}[/{style}]" if style else
                  f"verdict:  {end.verdict.status}: {end.verdict.text}")
    console.print(f"stopped: {end.stop_reason}")
    console.print(f"accepted: {len(end.accepted)}  {'; '.join(end.accepted)[:300]}")
    console.print(f"branch:   {end.branch}  in {end.workspace}")
    console.print(f"log:      {end.log_dir}   (verify: ratchet audit verify {end.log_dir})")
    if end.report:
        console.print(f"report:   {end.report}")


def _override_executor(spec: CampaignSpec, args: argparse.Namespace) -> CampaignSpec:
    executor = spec.executor.model_dump()
    if args.executor is not None:
        executor["kind"] = args.executor
    if args.slots is not None:
        executor["slots"] = args.slots
    if args.ray_address is not None:
        executor["ray"]["address"] = args.ray_address
    try:   # validated again: e.g. --slots 2 with a local executor is refused with the reason
        return spec.model_copy(update={"executor": ExecutorConfig.model_validate(executor)})
    except ValidationError as exc:
        raise SpecError(f"executor overrides: {exc.errors()[0]['msg']}") from None


@cli_errors
def run(args: argparse.Namespace) -> int:
    from agent.kernel_spec import is_kernel_spec

    if is_kernel_spec(Path(args.spec)):   # target.kind: kernel is a kernel campaign: `ratchet kernel` runs it
        from agent.commands.kernel import run as run_kernel

        return run_kernel(argparse.Namespace(spec=args.spec, max_iterations=args.max_iterations,
                                             wall_seconds=args.wall_seconds,
                                             log_dir=args.log_dir, workspaces=args.workspaces, out=None,
                                             proposer=args.proposer, llm_base_url=args.llm_base_url,
                                             llm_model=args.llm_model))
    spec = open_spec(args.spec)
    budget = spec.budget.model_dump() | {k: v for k in ("max_iterations", "wall_seconds")
                                         if (v := getattr(args, k)) is not None}
    try:   # validated like the spec's own budget: --wall-seconds 0 is refused with the reason
        spec = spec.model_copy(update={"budget": BudgetConfig.model_validate(budget)})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise SpecError(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}") from None
    if args.search_strategy is not None:
        search = spec.proposer.search.model_copy(update={"strategy": args.search_strategy})
        spec = spec.model_copy(update={"proposer": spec.proposer.model_copy(update={"search": search})})
    spec = _override_executor(spec, args)
    proposer = make_proposer(spec, args.proposer or spec.proposer.kind, base_url=args.llm_base_url,
                             model=args.llm_model)
    view = CampaignView(err_console, max_iterations=spec.budget.max_iterations, title=f"ratchet: {spec.name}")
    try:
        with view:
            end = start_campaign(spec, Path(args.spec), proposer=proposer, backend=make_backend(spec),
                                 log_root=Path(args.log_dir), workspace_root=Path(args.workspaces), on_event=view)
    except AuditError as exc:
        err_console.print(f"[red]audit log error:[/red] {exc}; the campaign stopped before acting")
        return 4
    print_end(end)
    return 0 if end.verdict.ok else 5
