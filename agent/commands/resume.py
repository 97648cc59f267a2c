"""`ratchet resume DIR [--wall-seconds S] [--checkout PATH]`: continue a crashed or killed campaign from its audit
log, same campaign id, on this host or a fresh one like it (agent/fresh_host.py: the signing key carried by
$RATCHET_AUDIT_KEY, the same accelerator model and software versions; the workspace rebuilt from the log). A campaign
whose loop ended on its wall budget continues with a new one (`--wall-seconds`). A kernel campaign's log (its start
record's kind "kernel") is resumed by agent/kernel_resume.py and ends as `ratchet kernel` does (summary, exit codes);
a serving campaign's by agent/campaign.py.

Exit codes: 2 the folder cannot be resumed here (no campaign log, a finished campaign, a log that does not verify, no
signing key, another kind of host, a missing input); otherwise those of the campaign's own command (`ratchet run`,
`ratchet kernel`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agent.campaign import resume_campaign
from agent.commands._common import cli_errors, err_console, make_backend
from agent.commands.run import make_proposer, print_end
from agent.errors import CampaignError
from agent.journal import read_journal
from agent.view import CampaignView

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("resume", help="continue a crashed campaign from its log folder")
    p.add_argument("dir", help="audit_logs/<campaign-id>")
    p.add_argument("--llm-base-url")
    p.add_argument("--llm-model")
    p.add_argument("--out", help="a kernel campaign: write its summary JSON here (and the .md beside it)")
    p.add_argument("--wall-seconds", type=float, help="the wall time this run may spend from now on (the budget "
                   "becomes what the log says was spent plus S); a campaign that ended on its wall budget needs it")
    p.add_argument("--checkout", type=Path, help="where the spec's own checkout is on this host, when the spec did "
                   "not lie in ratchet's (default: as recorded; paths under ratchet's checkout follow this one)")
    p.set_defaults(func=run)


@cli_errors
def run(args: argparse.Namespace) -> int:
    try:
        if read_journal(Path(args.dir)).kind == "kernel":
            return _kernel(args)
        view = CampaignView(err_console, max_iterations=0, title=f"ratchet resume: {args.dir}")
        with view:
            end = resume_campaign(
                Path(args.dir),
                proposer_for=lambda spec, kind: make_proposer(spec, kind, base_url=args.llm_base_url,
                                                              model=args.llm_model),
                backend_for=make_backend, on_event=view, wall_seconds=args.wall_seconds, checkout=args.checkout)
    except CampaignError as exc:
        err_console.print(f"[red]cannot resume:[/red] {exc}")
        return 2
    print_end(end)
    return 0 if end.verdict.ok else 5


def _kernel(args: argparse.Namespace) -> int:
    """A log that cannot be resumed raises CampaignError (exit 2); once the campaign runs, its failures and its
    end are answered as `ratchet kernel` answers them."""
    from agent.commands.kernel import answer_campaign, event, kernel_proposer
    from agent.kernel_resume import check_resumable, resume_kernel_campaign

    _, spec, _ = check_resumable(Path(args.dir).resolve(), wall_seconds=args.wall_seconds, checkout=args.checkout)
    return answer_campaign(lambda: resume_kernel_campaign(
        Path(args.dir), on_event=event, wall_seconds=args.wall_seconds, checkout=args.checkout,
        proposer_for=lambda spec, name: kernel_proposer(spec, name, base_url=args.llm_base_url,
                                                        model=args.llm_model)), spec, args.out)
