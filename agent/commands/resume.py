"""`ratchet resume DIR`: continue a crashed or killed campaign from its audit log, same campaign id."""

from __future__ import annotations

import argparse
from pathlib import Path

from agent.campaign import resume_campaign
from agent.commands._common import cli_errors, err_console, make_backend
from agent.commands.run import make_proposer, print_end
from agent.errors import CampaignError
from agent.view import CampaignView

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("resume", help="continue a crashed campaign from its log folder")
    p.add_argument("dir", help="audit_logs/<campaign-id>")
    p.add_argument("--llm-base-url")
    p.add_argument("--llm-model")
    p.set_defaults(func=run)


@cli_errors
def run(args: argparse.Namespace) -> int:
    view = CampaignView(err_console, max_iterations=0, title=f"ratchet resume: {args.dir}")
    try:
        with view:
            end = resume_campaign(
                Path(args.dir),
                proposer_for=lambda spec, kind: make_proposer(spec, kind, base_url=args.llm_base_url,
                                                              model=args.llm_model),
                backend_for=make_backend, on_event=view)
    except CampaignError as exc:
        err_console.print(f"[red]cannot resume:[/red] {exc}")
        return 2
    print_end(end)
    return 0 if end.verdict.ok else 5
