"""`ratchet resume DIR` of a kernel campaign (its start record's kind "kernel": agent/commands/resume.py hands it
here, as `ratchet replay` hands such a log to agent/kernel_replay.py), from its log alone, after a crash or a kill.

- The log must verify as a killed writer leaves it (agent/journal.py: chained, signed, every decision re-decided;
  only the records after the last checkpoint may be unsigned), or nothing happens.
- What the log says is the state: the iterations done, the budget spent (the allowed spend records, as the live
  gate counts it), the incumbent (the last accepted commit, else the kept prelude's, else the stock tree), the
  history the proposer sees, and which of the steps outside the loop already ran (baseline, prelude, final
  comparison, serving stage).
- What the killed process left is undone: its runner and servers still running are killed, its candidate trees
  removed, the branch reset to the incumbent (uncommitted work, and a commit whose result was never recorded,
  are dropped; `campaign.resume` says what was).
- An iteration with a hypothesis and no result is recorded once, failed (interrupted); the loop then goes on from
  the next iteration to its budget and the campaign ends as a live one does (kernel_campaign.run_to_end), a step
  already on record not run again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent import records
from agent.base import Proposer
from agent.campaign import reap_leftovers
from agent.errors import CampaignError
from agent.gatekeeper import Gatekeeper
from agent.journal import Journal, read_journal, restore_workspace, verify_for_resume
from agent.kernel_campaign import Event, KernelCampaign, KernelEnd, Recorded, kernel_limits, run_to_end
from agent.kernel_serving import load_serving_stage
from agent.kernel_spec import KernelSpec
from agent.measurements import HARNESS, Measurements
from audit import AuditWriter
from policies import load_policy
from sandbox.workspace import Workspace

__all__ = ["check_resumable", "resume_kernel_campaign"]


def check_resumable(log_dir: Path) -> tuple[Journal, KernelSpec]:
    """The journal and spec of a kernel campaign that can be resumed; else a CampaignError that says why (not a
    kernel campaign's log, a finished campaign, a log that does not verify, a missing workspace). Writes nothing."""
    journal = read_journal(log_dir)
    if journal.kind != "kernel":
        raise CampaignError(f"{log_dir} is not a kernel campaign's log (its campaign.start is of kind "
                            f"{journal.kind!r}); `ratchet resume` continues it as a serving campaign")
    if journal.ended:
        raise CampaignError(f"campaign {journal.campaign} is finished (its campaign.end is recorded): nothing to "
                            f"resume; `ratchet audit report {log_dir}` shows it, `ratchet kernel SPEC` starts a new "
                            "one")
    spec = KernelSpec.model_validate(journal.spec)
    verify_for_resume(log_dir, journal, spec.policy_file)
    if not (journal.workspace / ".git").is_dir():
        raise CampaignError(f"the campaign's workspace {journal.workspace} is missing (its git repository holds the "
                            f"branch {journal.branch}); restore it there, or start a new campaign with "
                            "`ratchet kernel SPEC`")
    return journal, spec


def resume_kernel_campaign(log_dir: Path, *, proposer_for: Callable[[KernelSpec, str], Proposer],
                           on_event: Event = lambda k, d: None, measure: Measurements = HARNESS) -> KernelEnd:
    """`proposer_for(spec, name)`: the proposer the start record names (kernel-search, llm, patches). A log that
    cannot be resumed is refused before anything is written (`check_resumable`)."""
    log_dir = log_dir.resolve()
    journal, spec = check_resumable(log_dir)
    serving = load_serving_stage(spec) if journal.served is None else None
    proposer = proposer_for(spec, journal.proposer)
    next_iteration = max(journal.last_iteration, journal.open_iteration or 0) + 1
    with AuditWriter.open(log_dir, campaign=journal.campaign) as writer:   # its lock: no campaign runs on this log
        pids, containers = reap_leftovers(log_dir)
        ws = Workspace.open(journal.workspace, spec.target.package)
        discarded = restore_workspace(ws, journal, log_dir / "runs")
        gate = Gatekeeper(policy=load_policy(spec.policy_file), writer=writer, root=ws.root,
                          limits=kernel_limits(spec), spent=dict(journal.spent))
        writer.append(records.CAMPAIGN_RESUME, payload={
            "incumbent": journal.incumbent_ref, "reaped_pids": pids, "reaped_containers": containers,
            "discarded": discarded, "next_iteration": next_iteration, "interrupted": journal.open_iterations})
        prelude = journal.prelude or {}
        camp = KernelCampaign(spec=spec, campaign_id=journal.campaign, log_dir=log_dir, writer=writer, gate=gate,
                              workspace=ws, proposer=proposer,
                              baseline_tunables=dict(prelude.get("tunables") or journal.start["tunables"]),
                              incumbent_ref=journal.incumbent_ref, history=list(journal.history),
                              next_iteration=next_iteration, on_event=on_event, measure=measure,
                              last_iteration_s=journal.last_round_s)
        for it in journal.open_iterations:
            camp.interrupted(it)
        if journal.open_iterations:
            writer.checkpoint()
        return run_to_end(camp, base_commit=journal.base_commit, branch=journal.branch, serving=serving,
                          recorded=Recorded(baseline=journal.baseline, prelude=journal.prelude, final=journal.final,
                                            final_failed=journal.final_failed, served=journal.served))
