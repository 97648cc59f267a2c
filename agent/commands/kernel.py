"""`ratchet kernel SPEC [--max-iterations N] [--log-dir DIR] [--workspaces DIR] [--out FILE.json]`: a kernel
campaign (`target.kind: kernel`, see experiments/README.md).

Exit codes: 0 the campaign ran to a budget or the proposer's end (accepted or not) and its log verifies;
2 bad input; 3 the baseline kernel, its prelude or the runner failed; 4 the audit log could not be written or does
not verify; 5 the end-to-end stage (`serving:`) ran and did not bear the kernel gain out (as `ratchet run`'s 5).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.commands._common import EXIT_HARNESS, cli_errors, console, err_console
from agent.errors import CampaignError
from audit import AuditError, anchor_path, default_anchor_dir, default_key_path, verify
from policies import load_policy, redecider

if TYPE_CHECKING:
    from agent.base import Proposer
    from agent.kernel_campaign import KernelEnd
    from agent.kernel_spec import KernelSpec

__all__ = ["register", "event", "kernel_proposer", "report_end"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("kernel", help="run a kernel campaign (target.kind: kernel): tunables search, checks, timing")
    p.add_argument("spec")
    p.add_argument("--max-iterations", type=int, help="override budget.max_iterations")
    p.add_argument("--wall-seconds", type=float, help="override budget.wall_seconds")
    p.add_argument("--log-dir", default="audit_logs", help="campaign logs go to DIR/<campaign-id>/")
    p.add_argument("--workspaces", default=".ratchet/workspaces", help="where campaign workspaces are created")
    p.add_argument("--out", help="write the summary JSON here (and the same name with .md)")
    p.add_argument("--serving", help="a serving spec for the end-to-end stage (overrides the spec's `serving:`): "
                                     "stock vs best served from the same vLLM tree decides the verdict")
    p.add_argument("--proposer", choices=("search", "llm", "patches"), help="default: the spec's proposer.kind")
    p.add_argument("--patch", action="append", default=[], metavar="FILE",
                   help="a patch file to propose (repeatable; implies --proposer patches; replaces proposer.patches)")
    p.add_argument("--llm-base-url", help="OpenAI-compatible endpoint for --proposer llm")
    p.add_argument("--llm-model", help="model name for --proposer llm")
    p.set_defaults(func=run)


def event(kind: str, data: dict[str, Any]) -> None:
    if kind == "iteration":
        err_console.print(f"[bold]iteration {data['iteration']}[/bold]")
    elif kind == "phase":
        err_console.print(f"  {data['phase']}")
    elif kind == "hypothesis":
        err_console.print(f"  hypothesis: {data['text'][:200]}")
    elif kind == "result":
        e = data["entry"]
        err_console.print(f"  -> {e.outcome} {e.speedup or ''} {e.detail[:200]}", markup=False)


def kernel_proposer(spec: KernelSpec, kind: str, *, base_url: str | None = None,
                    model: str | None = None) -> Proposer:
    """The proposer of `kind` (search, llm, patches; a start record names the search `kernel-search`), as the spec
    configures it (`patches`: the spec's proposer.patches)."""
    if kind == "patches":
        from agent.proposers.patch_files import PatchFilesProposer

        return PatchFilesProposer(spec.proposer.patches)
    if kind == "llm":
        from agent.proposers.llm import LLMConfig, LLMProposer

        settings = spec.proposer.llm.model_dump(exclude_none=True)
        settings.update({k: v for k, v in (("base_url", base_url), ("model", model)) if v})
        return LLMProposer(LLMConfig(**settings))
    from agent.proposers.kernel_search import KernelSearchProposer

    return KernelSearchProposer(spec.proposer.search, kernel_file=spec.target.kernel_file)


def report_end(end: KernelEnd, spec: KernelSpec, out: str | None) -> int:
    """Verify the ended campaign's log, print its summary (and write it to `out`); the command's exit code."""
    from agent.kernel_report import render_markdown, summarize

    anchor = anchor_path(default_anchor_dir(default_key_path()), end.campaign_id)
    checked = verify(end.log_dir, redecide=redecider([load_policy(spec.policy_file)]),
                     anchor=anchor if anchor.exists() else None)
    summary = summarize(end, checked)
    text = render_markdown(summary)
    console.print(text, markup=False, highlight=False)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=1) + "\n")
        path.with_suffix(".md").write_text(text)
        console.print(f"summary: {path} and {path.with_suffix('.md')}")
    console.print(f"log: {end.log_dir}   (verify: ratchet audit verify {end.log_dir})")
    if not checked.ok:
        return 4
    return 5 if end.serving and end.serving["verdict"]["status"] == "not-shown" else 0


def answer_campaign(campaign: Callable[[], KernelEnd], spec: KernelSpec, out: str | None) -> int:
    """Run a kernel campaign (new or resumed) and answer as `ratchet kernel` does: its end reported, an audit
    failure exit 4, a campaign error the harness's exit."""
    try:
        end = campaign()
    except AuditError as exc:
        err_console.print(f"[red]audit log error:[/red] {exc}; the campaign stopped before acting")
        return 4
    except CampaignError as exc:
        err_console.print(f"[red]campaign error:[/red] {exc}", markup=True, highlight=False)
        return EXIT_HARNESS
    return report_end(end, spec, out)


@cli_errors
def run(args: argparse.Namespace) -> int:
    from agent.kernel_campaign import start_kernel_campaign
    from agent.kernel_spec import load_kernel_spec

    spec = load_kernel_spec(Path(args.spec))
    budget = spec.budget.model_copy(update={k: v for k, v in (("max_iterations", args.max_iterations),
                                                              ("wall_seconds", args.wall_seconds)) if v is not None})
    spec = spec.model_copy(update={"budget": budget})
    if getattr(args, "serving", None):
        spec = type(spec).model_validate({**spec.model_dump(), "serving": Path(args.serving).resolve()})
    kind = "patches" if getattr(args, "patch", None) else (getattr(args, "proposer", None) or spec.proposer.kind)
    if kind == "patches":
        files = [Path(f).resolve() for f in getattr(args, "patch", None) or []] or list(spec.proposer.patches)
        if not files:
            err_console.print("ratchet kernel: --proposer patches needs --patch FILE or proposer.patches in the spec")
            return 2
        # recorded in the spec (campaign.start), so that a resume proposes the same files
        spec = spec.model_copy(update={"proposer": spec.proposer.model_copy(update={"patches": files})})
    proposer = kernel_proposer(spec, kind, base_url=getattr(args, "llm_base_url", None),
                               model=getattr(args, "llm_model", None))
    return answer_campaign(lambda: start_kernel_campaign(spec, Path(args.spec), log_root=Path(args.log_dir),
                                                workspace_root=Path(args.workspaces), on_event=event,
                                                proposer=proposer), spec, args.out)
