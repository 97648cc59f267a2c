"""The kinds of record a campaign writes to its audit log, in one place: the writers (engine.py, campaign.py,
serving_campaign.py, kernel_campaign.py, trial.py, tools.py, incumbent_profile.py, gatekeeper.py) and the readers
(journal.py, replay.py) name them from here. audit/ reads some of them too but imports nothing of ours (data flows one
way), so tests/agent/test_records.py checks that every kind audit/ names is one of these.

The strings are the log's format: old logs carry them, so a kind is never renamed, only added. The audit
package's own kinds (log.open, checkpoint, recovery, and evidence: the manifests agent/evidence.py writes through
audit.append_evidence) belong to audit/.
"""

from __future__ import annotations

__all__ = ["KINDS", "NOTE_KINDS", "note_kind"]

CAMPAIGN_START = "campaign.start"        # spec, workspace, branch, base commit, policy, environment, measurement
CAMPAIGN_RESUME = "campaign.resume"      # the incumbent resumed from, what was reaped, the next iteration
CAMPAIGN_END = "campaign.end"            # verdict, stop reason, accepted iterations, spent, final figures
CAMPAIGN_HOST = "campaign.host"          # a resume on another machine: that host, what was carried and moved
EXECUTOR_START = "executor.start"        # where evaluations run (local, or the Ray cluster's nodes)
BASELINE_RESULT = "baseline.result"      # the stock grid, the parity reference's file and hash
BASELINE_PROFILE = "baseline.profile"    # the stock build's top ops (for a proposer that reads profiles)
INCUMBENT_PROFILE = "incumbent.profile"  # the same after an accepted change
ENGINE_DEFAULTS = "engine.defaults"      # the engine args vLLM resolves for the incumbent
ACTION = "action"                        # one gate decision (every action, allowed or denied)
ERROR = "error"                          # a failure that did not stop the campaign (phase, type, message)
ITERATION_HYPOTHESIS = "iteration.hypothesis"  # what should move, by how much, from which proposer
ITERATION_PATCH = "iteration.patch"      # the candidate's diff (as applied) and its tree hash
ITERATION_PARITY = "iteration.parity"    # a candidate's parity report (screen, confirmation)
ITERATION_CONFIRM = "iteration.confirm"  # the screen that earned a confirmation
ITERATION_RETRY = "iteration.retry"      # an evaluation resubmitted after its worker was lost
ITERATION_PORT_RETRY = "iteration.port_retry"  # an evaluation re-gated on new ports (one was taken)
ITERATION_RESULT = "iteration.result"    # the outcome, its reason and figures, the commit when accepted
FINAL_RESULT = "final.result"            # a kernel campaign's best vs baseline
PRELUDE_RESULT = "prelude.result"        # a kernel campaign's prelude patch vs the stock file: kept or not, why
SERVING_RESULT = "serving.result"        # a kernel campaign's best served end to end vs stock: grid, parity, verdict
KERNEL_EVALUATION = "kernel.evaluation"  # one kernel runner's checks and timings

# What a proposer's tools record (GatedTools.note): "agent." + one of these.
NOTE_KINDS = ("llm.turn", "llm.retry", "llm.tool_error", "llm.end", "llm.context_shrunk", "try_patch", "check_kernel")


def note_kind(name: str) -> str:
    """The record kind of a proposer's note; an unknown name is a programming error, not a new kind."""
    if name not in NOTE_KINDS:
        raise ValueError(f"unknown note kind {name!r}; add it to agent/records.py NOTE_KINDS")
    return f"agent.{name}"


KINDS = frozenset({CAMPAIGN_START, CAMPAIGN_RESUME, CAMPAIGN_END, CAMPAIGN_HOST, EXECUTOR_START, BASELINE_RESULT,
                   BASELINE_PROFILE, INCUMBENT_PROFILE, ENGINE_DEFAULTS, ACTION, ERROR, ITERATION_HYPOTHESIS,
                   ITERATION_PATCH, ITERATION_PARITY, ITERATION_CONFIRM, ITERATION_RETRY, ITERATION_PORT_RETRY,
                   ITERATION_RESULT, FINAL_RESULT, PRELUDE_RESULT, SERVING_RESULT, KERNEL_EVALUATION,
                   *(f"agent.{n}" for n in NOTE_KINDS)})
