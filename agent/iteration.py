"""The steps of an iteration that are the same for every target (agent/engine.py runs them; serving:
agent/serving_campaign.py, kernel: agent/kernel_campaign.py): ask the proposer and record its hypothesis, turn an
error into the iteration's outcome (one exception ladder), commit an accepted change with its trailers, and record
the outcome with the history entry the next proposals see. The target decides how a candidate is measured and
judged."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent import records
from agent.base import (
    MAX_HISTORY_DETAIL,
    MAX_HISTORY_PATCH,
    CampaignState,
    GiveUp,
    HistoryEntry,
    Outcome,
    Proposal,
    Proposer,
    cell_lines,
)
from agent.errors import ActionDenied, BudgetExhausted
from agent.executor import WorkerLost
from agent.tools import GatedTools
from audit import AuditError, AuditWriter
from harness.errors import HarnessError, MeasurementTampered
from sandbox.errors import PatchRejected, SandboxError
from sandbox.workspace import Workspace

__all__ = ["INTERRUPTED", "propose", "classify", "commit", "record_outcome"]

Event = Callable[[str, dict[str, Any]], None]

# The outcome's reason of an iteration a crash or a kill cut short (a hypothesis and no result), recorded once by
# the resume that finds it (agent/campaign.py, agent/kernel_resume.py); its outcome is "failed".
INTERRUPTED = "interrupted (crash or kill); resumed"


def propose(proposer: Proposer, state: CampaignState, tools: GatedTools, *, writer: AuditWriter, campaign_id: str,
            on_event: Event) -> Proposal | GiveUp:
    """The proposer's next candidate (its randomness seeded by campaign and iteration, so a resume proposes the
    same), its hypothesis recorded before anything of it runs."""
    i = state.iteration
    result = proposer.propose(state, tools, rng=random.Random(f"{campaign_id}:{i}"))
    if isinstance(result, Proposal):
        writer.append(records.ITERATION_HYPOTHESIS, iteration=i, payload={
            "hypothesis": result.hypothesis, "predicted_speedup": result.predicted_speedup,
            "target_cells": list(result.target_cells), "source": result.source, "proposer": proposer.name,
            "patch_format": result.patch_format})
        on_event("hypothesis", {"text": result.hypothesis})
    return result


def classify(writer: AuditWriter, i: int, exc: BaseException) -> tuple[Outcome, str]:
    """An error during an iteration becomes its outcome; only a budget end or an unwritable log stop the campaign
    (re-raised). An error ratchet has no name for is recorded whole and the campaign goes on."""
    if isinstance(exc, (BudgetExhausted, AuditError)):
        raise exc
    if isinstance(exc, ActionDenied):
        return "denied", str(exc)
    if isinstance(exc, PatchRejected):
        return "invalid", f"patch rejected: {exc}"
    if isinstance(exc, MeasurementTampered):
        return "tampered", f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (HarnessError, SandboxError, WorkerLost)):
        return "failed", f"{type(exc).__name__}: {exc}"
    writer.append(records.ERROR, payload={"type": type(exc).__name__, "message": str(exc)[:4000]}, iteration=i)
    return "failed", f"{type(exc).__name__}: {exc}"


def commit(workspace: Workspace, writer: AuditWriter, *, campaign_id: str, iteration: int, proposal: Proposal,
           title: str, speedup: object, evidence: Sequence[str] = (), per: Sequence[str] = ()) -> str:
    """Commit the workspace's applied change on the campaign branch, with the trailers a reviewer and `replay`
    read: campaign, iteration, speedup, the target's `evidence` (e.g. the parity digest), the prediction, the audit
    seq of the result record that follows, and one line per cell or shape (`per`)."""
    trailers = [f"Ratchet-Campaign: {campaign_id}", f"Ratchet-Iteration: {iteration}", f"Ratchet-Speedup: {speedup}",
                *evidence, f"Ratchet-Predicted: {proposal.predicted_speedup}",
                f"Ratchet-Audit-Seq: {writer.next_seq}", *per]
    return workspace.commit(f"ratchet: {title}\n\n{proposal.hypothesis}\n\n" + "\n".join(trailers))


def record_outcome(writer: AuditWriter, history: list[HistoryEntry], on_event: Event, i: int, outcome: Outcome,
                   reason: str, proposal: Proposal | None, *, commit: str | None, parity_ok: bool,
                   tree: str | None = None, commit_object: str | None = None,
                   figures: Mapping[str, Any] | None = None) -> HistoryEntry:
    """Record an iteration's outcome (`figures`: the target's measured evidence, e.g. speedup, cells, shapes) and
    append the history entry the next proposals see. An accepted one's `commit_object` (the raw git object) lets a
    resume on another host write the branch again with the same hashes (agent/rebuild.py)."""
    payload: dict[str, Any] = {"outcome": outcome, "accepted": outcome == "accepted",
                               "reason": reason[:MAX_HISTORY_DETAIL], "parity_ok": parity_ok, "commit": commit,
                               "hypothesis": proposal.hypothesis if proposal else "",
                               "source": proposal.source if proposal else "",
                               "predicted_speedup": proposal.predicted_speedup if proposal else None}
    if tree:
        payload["tree"] = tree   # replay checks that it rebuilds this exact tree
    if commit_object:
        payload["commit_object"] = commit_object
    payload.update(figures or {})
    writer.append(records.ITERATION_RESULT, iteration=i, payload=payload)
    entry = HistoryEntry(iteration=i, hypothesis=payload["hypothesis"], outcome=outcome,
                         speedup=payload.get("speedup_text"), predicted_speedup=payload["predicted_speedup"],
                         detail=reason[:MAX_HISTORY_DETAIL], source=payload["source"],
                         patch=(proposal.patch if proposal else "")[:MAX_HISTORY_PATCH], cells=cell_lines(payload))
    history.append(entry)
    on_event("result", {"entry": entry})
    return entry
