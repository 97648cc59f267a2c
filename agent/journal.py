"""Reading a campaign back from its audit log: what `ratchet resume` needs to continue exactly where
the log ends (the log is the only state; nothing else is trusted after a crash)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import records
from agent.base import MAX_HISTORY_DETAIL, MAX_HISTORY_PATCH, HistoryEntry, cell_lines
from agent.errors import CampaignError
from audit.reader import payload_of, read_records

__all__ = ["Journal", "read_journal"]


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
    measurement_sha256: str | None = None     # the measurement path's digest when the campaign began
    target_image: dict[str, Any] | None = None    # vllm-image: the image and vLLM the workspace was copied from

    @property
    def open_iteration(self) -> int | None:
        return max(self.open_iterations) if self.open_iterations else None


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
                      measurement_sha256=p.get("measurement_sha256"), target_image=p.get("target_image"))
    hypotheses: dict[int, dict[str, Any]] = {}
    patches: dict[int, str] = {}
    for record in log:
        kind, it = record.get("kind"), record.get("iteration")
        if kind in ("checkpoint", "log.open", "recovery"):
            continue
        body = payload_of(directory, record)
        if kind == records.BASELINE_RESULT:
            journal.baseline = body
            journal.incumbent_rows = list(body["cells"])
        elif kind == records.ACTION and body.get("action", {}).get("kind") == "spend" \
                and record.get("decision") == "allow":
            action = body["action"]
            journal.spent[action["resource"]] = journal.spent.get(action["resource"], 0.0) + float(action["amount"])
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
                journal.incumbent_rows = list(body.get("cells_rows", journal.incumbent_rows))
        elif kind in (records.BASELINE_PROFILE, records.INCUMBENT_PROFILE):   # the latest is the incumbent's
            journal.profile = str(body.get("text", "")) or None
        elif kind == records.CAMPAIGN_END:
            journal.ended = True
    return journal
