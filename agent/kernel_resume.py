"""`ratchet resume DIR` of a kernel campaign (its start record's kind "kernel": agent/commands/resume.py hands it
here, as `ratchet replay` hands such a log to agent/kernel_replay.py), from its log alone, after a crash or a kill.

- The log must verify as a killed writer leaves it (agent/journal.py: chained, signed, every decision re-decided;
  only the records after the last checkpoint may be unsigned), or nothing happens; on another host, that host must
  be like the recorded one and have what the spec reads (agent/fresh_host.py), and a missing workspace is rebuilt
  from the log (agent/rebuild.py).
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
from functools import partial
from pathlib import Path

from agent.base import Proposer
from agent.engine import Event, reopen
from agent.errors import CampaignError
from agent.fresh_host import Arrival, arrive, check_inputs, continuation, resumed_limits
from agent.host import HostProbe, probe_host
from agent.journal import Journal, read_journal, verify_for_resume
from agent.kernel_campaign import KernelCampaign, KernelEnd, Recorded, kernel_limits
from agent.kernel_serving import load_serving_stage
from agent.kernel_spec import KernelSpec
from agent.measurements import HARNESS, Measurements
from agent.rebuild import open_or_rebuild

__all__ = ["check_resumable", "resume_kernel_campaign"]


# What a kernel spec reads from the host (checked before a resume writes anything)
SPEC_INPUTS = ("policy", "serving", "target.source", "target.prelude", "proposer.patches")


def check_resumable(log_dir: Path, *, wall_seconds: float | None = None, probe: HostProbe = probe_host,
                    checkout: Path | None = None) -> tuple[Journal, KernelSpec, Arrival]:
    """The journal and spec of a kernel campaign that can be resumed on this host (agent/fresh_host.py: the signing
    key, the host, the spec's paths moved under this host's checkouts); else a CampaignError that says why (not a
    kernel campaign's log, a finished campaign, a log that does not verify, a missing input). Writes nothing."""
    journal = read_journal(log_dir)
    if journal.kind != "kernel":
        raise CampaignError(f"{log_dir} is not a kernel campaign's log (its campaign.start is of kind "
                            f"{journal.kind!r}); `ratchet resume` continues it as a serving campaign")
    continuation(journal, wall_seconds, log_dir)
    here = arrive(log_dir, journal.start, journal.spec, campaign=journal.campaign, last_host=journal.host,
                  spec_path=journal.spec_path, workspace=journal.workspace, probe=probe, checkout=checkout)
    spec = KernelSpec.model_validate(here.spec)
    verify_for_resume(log_dir, journal, spec.policy_file)
    check_inputs(here.spec, SPEC_INPUTS, (here.record or {}).get("moved", {}))
    return journal, spec, here


def resume_kernel_campaign(log_dir: Path, *, proposer_for: Callable[[KernelSpec, str], Proposer],
                           on_event: Event = lambda k, d: None, measure: Measurements = HARNESS,
                           wall_seconds: float | None = None, probe: HostProbe = probe_host,
                           checkout: Path | None = None) -> KernelEnd:
    """`proposer_for(spec, name)`: the proposer the start record names (kernel-search, llm, patches). A log that
    cannot be resumed is refused before anything is written (`check_resumable`). `wall_seconds`: what this run may
    spend from now (a campaign whose loop ended on its wall budget continues with it)."""
    log_dir = log_dir.resolve()
    journal, spec, here = check_resumable(log_dir, wall_seconds=wall_seconds, probe=probe, checkout=checkout)
    continued = continuation(journal, wall_seconds, log_dir)
    serving = load_serving_stage(spec) if journal.served is None or continued else None
    proposer = proposer_for(spec, journal.proposer)
    limits, budget = resumed_limits(kernel_limits(spec), journal, wall_seconds)
    place = partial(open_or_rebuild, journal, here.workspace, package=spec.target.package, serving={},
                    source=lambda: spec.target.source_dir)
    with reopen(log_dir, journal, policy_path=spec.policy_file, package=spec.target.package, limits=limits,
                host=here.record, workspace=place,
                resume={**budget, **({"continued": True} if continued else {})}) as opened:
        if continued:   # its conclusion (final comparison, serving stage) runs again after the new loop
            journal.final, journal.final_failed, journal.served = None, False, None
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
