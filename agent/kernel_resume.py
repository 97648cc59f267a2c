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
  the next iteration to its budget and the campaign ends as a live one does (the engine's run_to_end), a step
  already on record not run again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent.base import Proposer
from agent.engine import Event, reopen
from agent.errors import CampaignError
from agent.journal import Journal, read_journal, verify_for_resume
from agent.kernel_campaign import KernelCampaign, KernelEnd, Recorded, kernel_limits
from agent.kernel_serving import load_serving_stage
from agent.kernel_spec import KernelSpec
from agent.measurements import HARNESS, Measurements

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
    with reopen(log_dir, journal, policy_path=spec.policy_file, package=spec.target.package,
                limits=kernel_limits(spec)) as opened:
        prelude = journal.prelude or {}
        camp = KernelCampaign(spec=spec, campaign_id=journal.campaign, log_dir=log_dir, writer=opened.writer,
                              gate=opened.gate, workspace=opened.workspace, proposer=proposer,
                              baseline_tunables=dict(prelude.get("tunables") or journal.start["tunables"]),
                              incumbent_ref=journal.incumbent_ref, history=list(journal.history),
                              next_iteration=opened.next_iteration, on_event=on_event, measure=measure,
                              last_iteration_s=journal.last_round_s, serving=serving,
                              recorded=Recorded(baseline=journal.baseline, prelude=journal.prelude,
                                                final=journal.final, final_failed=journal.final_failed,
                                                served=journal.served))
        camp.close_interrupted(journal.open_iterations)
        return camp.run_to_end(base_commit=journal.base_commit, branch=journal.branch)
