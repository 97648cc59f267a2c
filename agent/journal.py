"""Reading a campaign back from its audit log: what `ratchet resume` needs to continue exactly where
the log ends (the log is the only state; nothing else is trusted after a crash), and the check that the log is
intact before a resume trusts it. Serving and kernel campaigns (agent/kernel_resume.py) read the same journal: the
kernel's own steps outside the loop (prelude, final comparison, serving stage) are read back as recorded."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import records
from agent.base import MAX_HISTORY_DETAIL, MAX_HISTORY_PATCH, HistoryEntry, cell_lines
from agent.errors import CampaignError
from audit import anchor_path, default_anchor_dir, default_key_path, verify
from audit.reader import payload_of, read_records
from policies import load_policy, redecider
from policies.known import known_policies
from sandbox.workspace import Workspace

__all__ = ["Committed", "Journal", "read_journal", "restore_workspace", "verify_for_resume", "ended_on_wall_budget"]


@dataclass(frozen=True)
class Committed:
    """One commit of the campaign branch as the log records it: what a rebuild applies and writes again."""

    label: str              # "prelude", "iteration 3"
    diff: str               # the patch applied on the commit before it
    commit: str             # its hash
    raw: str | None         # its raw git object (None in logs from before it was recorded)


def ended_on_wall_budget(stop_reason: str, ended_by: str | None = None) -> bool:
    """Whether a campaign's loop stopped on its wall budget (campaign.end's `ended_by`; older logs: the reason)."""
    return ended_by == "wall_seconds" or stop_reason.startswith(("wall-time budget", "budget exhausted: wall_seconds"))


@dataclass
class Journal:
    campaign: str
    spec_path: Path
    spec: dict[str, Any]
    workspace: Path
    branch: str
    proposer: str
    base_commit: str
    baseline: dict[str, Any] | None = None
    incumbent_ref: str = ""
    incumbent_rows: list[dict[str, Any]] = field(default_factory=list)
    history: list[HistoryEntry] = field(default_factory=list)
    spent: dict[str, float] = field(default_factory=dict)
    last_iteration: int = 0
    open_iterations: list[int] = field(default_factory=list)   # a hypothesis but no result (crashed mid-round)
    ended: bool = False
    profile: str | None = None
    profile_steps: dict[str, dict[str, float]] = field(default_factory=dict)   # absent from logs before the table
    measurement_sha256: str | None = None     # the measurement path's digest when the campaign began
    target_image: dict[str, Any] | None = None    # vllm-image: the image and vLLM the workspace was copied from
    start: dict[str, Any] = field(default_factory=dict)   # the campaign.start payload
    last_round_s: float = 0.0       # the wall seconds the last round (iteration) spent: what the loop plans with
    prelude: dict[str, Any] | None = None     # kernel: the prelude.result payload
    final: dict[str, Any] | None = None       # kernel: the final.result payload
    final_failed: bool = False                # the final comparison ran and failed (its error is recorded)
    served: dict[str, Any] | None = None      # kernel: the serving.result payload
    branch_commits: list[Committed] = field(default_factory=list)   # the branch after its base, in order
    stop_reason: str = ""                     # campaign.end's, when it ended
    ended_by: str | None = None               # campaign.end's: "wall_seconds" when the wall budget stopped the loop
    host: dict[str, Any] | None = None        # the last host recorded (campaign.start's, then each campaign.host)
    wall_limit: float | None = None           # the wall budget the last resume given one metered (spent + given)

    @property
    def open_iteration(self) -> int | None:
        return max(self.open_iterations) if self.open_iterations else None

    @property
    def kind(self) -> str:
        """The campaign's target as its start record names it: "kernel", else a serving campaign."""
        return str(self.start.get("kind") or "serving")


def read_journal(directory: Path) -> Journal:
    if not (directory / "log.jsonl").exists():
        raise CampaignError(f"{directory} holds no log.jsonl; pass the campaign folder audit_logs/<campaign-id>")
    log = read_records(directory)
    start = next((r for r in log if r.get("kind") == records.CAMPAIGN_START), None)
    if start is None:
        raise CampaignError(f"{directory}/log.jsonl has no campaign.start record: not a ratchet campaign log")
    p = payload_of(directory, start)
    journal = Journal(campaign=str(start["campaign"]), spec_path=Path(p["spec_path"]), spec=p["spec"],
                      workspace=Path(p["workspace"]), branch=str(p["branch"]), proposer=str(p["proposer"]),
                      base_commit=str(p["base_commit"]), incumbent_ref=str(p["base_commit"]),
                      measurement_sha256=p.get("measurement_sha256"), target_image=p.get("target_image"), start=p,
                      host=p.get("host"))
    hypotheses: dict[int, dict[str, Any]] = {}
    patches: dict[int, str] = {}
    for record in log:
        kind, it = record.get("kind"), record.get("iteration")
        if kind in ("checkpoint", "log.open", "recovery"):
            continue
        body = payload_of(directory, record)
        if kind == records.BASELINE_RESULT:
            journal.baseline = body
            journal.incumbent_rows = list(body.get("cells", ()))   # a kernel baseline has shapes instead
        elif kind == records.ACTION and body.get("action", {}).get("kind") == "spend" \
                and record.get("decision") == "allow":
            action = body["action"]
            journal.spent[action["resource"]] = journal.spent.get(action["resource"], 0.0) + float(action["amount"])
            if action["resource"] == "wall_seconds" and isinstance(it, int) and it >= 1:
                journal.last_round_s = float(action["amount"])
        elif kind == records.PRELUDE_RESULT:
            journal.prelude = body
            if body.get("kept") and body.get("commit"):
                journal.incumbent_ref = str(body["commit"])
                journal.branch_commits.append(Committed("prelude", str(body.get("diff", "")), str(body["commit"]),
                                                        body.get("commit_object")))
        elif kind == records.FINAL_RESULT:
            journal.final = body
        elif kind == records.ERROR and body.get("phase") == "final":
            journal.final_failed = True
        elif kind == records.SERVING_RESULT:
            journal.served = body
        elif kind == records.ITERATION_HYPOTHESIS and isinstance(it, int):
            hypotheses[it] = body
            journal.open_iterations.append(it)
        elif kind == records.ITERATION_PATCH and isinstance(it, int):
            patches[it] = str(body.get("diff", ""))
        elif kind == records.ITERATION_RESULT and isinstance(it, int):
            hyp = hypotheses.get(it, {})
            journal.history.append(HistoryEntry(
                iteration=it, hypothesis=str(hyp.get("hypothesis", body.get("hypothesis", ""))),
                outcome=body["outcome"], speedup=body.get("speedup_text"),
                predicted_speedup=hyp.get("predicted_speedup"),
                detail=str(body.get("reason", ""))[:MAX_HISTORY_DETAIL],
                source=str(hyp.get("source", body.get("source", ""))),
                patch=patches.get(it, "")[:MAX_HISTORY_PATCH], cells=cell_lines(body)))
            journal.last_iteration = max(journal.last_iteration, it)
            journal.open_iterations = [o for o in journal.open_iterations if o != it]
            if body.get("accepted"):
                journal.incumbent_ref = str(body["commit"])
                journal.branch_commits.append(Committed(f"iteration {it}", patches.get(it, ""), str(body["commit"]),
                                                        body.get("commit_object")))
                journal.incumbent_rows = list(body.get("cells_rows", journal.incumbent_rows))
        elif kind in (records.BASELINE_PROFILE, records.INCUMBENT_PROFILE):   # the latest is the incumbent's
            journal.profile = str(body.get("text", "")) or None
            steps = body.get("steps")
            journal.profile_steps = steps if isinstance(steps, dict) else {}
        elif kind == records.CAMPAIGN_END:
            journal.ended = True
            journal.stop_reason, journal.ended_by = str(body.get("stop_reason", "")), body.get("ended_by")
        elif kind == records.CAMPAIGN_HOST:
            journal.host = body.get("host")
        elif kind == records.CAMPAIGN_RESUME:
            if body.get("wall_seconds_limit") is not None:   # a resume given --wall-seconds: its limit holds on
                journal.wall_limit = float(body["wall_seconds_limit"])
            if body.get("continued"):   # ended on its wall budget, continued with a new one: it concludes again
                journal.ended, journal.final, journal.final_failed, journal.served = False, None, False, None
    return journal


def verify_for_resume(directory: Path, journal: Journal, policy: Path) -> None:
    """Fail closed unless the log is as its killed writer left it: every record chained to the one before, every
    checkpoint's signature good, the anchor kept beside the key (when there is one) still in the log, every gate
    decision re-decided the same (under `policy` or a policy ratchet shipped). Only the records after the last
    checkpoint may be unsigned and the last line torn: that is what a kill leaves."""
    anchor = anchor_path(default_anchor_dir(default_key_path()), journal.campaign)
    policies = ([load_policy(policy)] if policy.is_file() else []) + known_policies()
    checked = verify(directory, redecide=redecider(policies), anchor=anchor if anchor.exists() else None,
                     open_tail=True)
    if not checked.ok:
        raise CampaignError(f"{directory / 'log.jsonl'} does not verify (seq {checked.bad_seq}: {checked.reason}): "
                            f"a campaign resumes only from an intact log; `ratchet audit verify {directory}` shows "
                            "where it was changed; start a new campaign instead")


def restore_workspace(ws: Workspace, journal: Journal, scratch: Path) -> dict[str, Any]:
    """The workspace as the log says it is: the killed run's trees under `scratch` (its runs folder) removed, the
    campaign branch checked out at the incumbent, nothing uncommitted: the work of an iteration cut short, and a
    commit the log does not record as accepted, are dropped. Returns what was dropped, for the resume record."""
    dirty = not ws.is_clean()
    ws.repo.git.worktree("prune")
    for tree in ws.copies():
        if tree.is_relative_to(scratch.resolve()):
            ws.remove_copy(tree)
    # trees git no longer lists there: those of a workspace left on another host (the folder was carried here)
    for marker in (m for depth in ("*", "*/*", "*/*/*") for m in scratch.glob(f"{depth}/.git") if m.is_file()):
        shutil.rmtree(marker.parent, ignore_errors=True)
    ws.repo.git.checkout("-q", "-f", journal.branch)
    head = ws.head()
    ws.reset(journal.incumbent_ref)
    return {"uncommitted": dirty, "head": head if head != journal.incumbent_ref else None}
