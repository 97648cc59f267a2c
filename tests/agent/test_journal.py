"""Reading a campaign back from its log: the only state `ratchet resume` trusts."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import CampaignError
from agent.journal import read_journal
from audit import AuditWriter


def _log(tmp_path: Path) -> tuple[Path, AuditWriter]:
    log = tmp_path / "log"
    writer = AuditWriter.open(log, campaign="c-1", key_path=tmp_path / "key", anchor_dir=tmp_path / "anchors")
    writer.append("campaign.start", payload={"spec_path": "/s.yaml", "spec": {"name": "s"}, "workspace": "/ws",
                                             "branch": "ratchet/c-1", "proposer": "search", "base_commit": "b0"})
    writer.append("baseline.result", iteration=0, payload={"cells": [{"cell": "in8/out4"}], "reference_sha256": "x"})
    return log, writer


def _spend(writer: AuditWriter, amount: float, decision: str = "allow") -> None:
    writer.append("action", iteration=1, decision=decision, rule="r", payload={
        "action": {"kind": "spend", "resource": "llm_tokens", "amount": amount}})


def test_history_incumbent_and_spending_come_back_from_the_log(tmp_path: Path) -> None:
    log, w = _log(tmp_path)
    w.append("iteration.hypothesis", iteration=1, payload={"hypothesis": "h1", "source": "search:a",
                                                           "predicted_speedup": 1.1})
    _spend(w, 100)
    _spend(w, 5000, decision="deny")      # a denied spend did not happen
    w.append("iteration.result", iteration=1, payload={"outcome": "accepted", "accepted": True, "commit": "c1",
                                                       "cells_rows": [{"cell": "in8/out4", "x": 2}],
                                                       "speedup_text": "1.2x [1.1, 1.3]", "reason": "ok"})
    w.append("iteration.hypothesis", iteration=2, payload={"hypothesis": "h2", "source": "search:b"})
    w.close()
    j = read_journal(log)
    assert (j.campaign, j.base_commit, j.incumbent_ref, j.branch) == ("c-1", "b0", "c1", "ratchet/c-1")
    assert j.incumbent_rows == [{"cell": "in8/out4", "x": 2}]
    assert [(h.iteration, h.outcome, h.source, h.speedup) for h in j.history] == \
        [(1, "accepted", "search:a", "1.2x [1.1, 1.3]")]
    assert j.spent == {"llm_tokens": 100.0}
    assert (j.last_iteration, j.open_iteration, j.ended, j.kind) == (1, 2, False, "serving")


def test_a_folder_without_a_campaign_log_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CampaignError, match="no log.jsonl"):
        read_journal(tmp_path)
    log = tmp_path / "other"
    with AuditWriter.open(log, campaign="c-2", key_path=tmp_path / "key", anchor_dir=tmp_path / "a") as w:
        w.append("note", payload={})
    with pytest.raises(CampaignError, match="no campaign.start"):
        read_journal(log)


def test_a_resumed_history_keeps_each_patch_per_cell_result_and_the_whole_failure(tmp_path: Path) -> None:
    log, w = _log(tmp_path)
    traceback = "Traceback (most recent call last):\n" + "  frame\n" * 300 + "RuntimeError: shape mismatch"
    w.append("iteration.hypothesis", iteration=1, payload={"hypothesis": "fuse", "source": "llm:m"})
    w.append("iteration.patch", iteration=1, payload={"diff": "diff --git a/x b/x\n+y\n", "base": "b0"})
    w.append("iteration.result", iteration=1, payload={
        "outcome": "failed", "accepted": False, "reason": f"server crashed:\n{traceback}",
        "cells": {"in8/out4": {"headline": {"ratio": 1.04, "low": 0.97, "high": 1.11}}}})
    w.close()
    (entry,) = read_journal(log).history
    assert entry.patch == "diff --git a/x b/x\n+y\n" and entry.cells == ("in8/out4 1.040x [0.970, 1.110]",)
    assert entry.detail.endswith("RuntimeError: shape mismatch") and len(entry.detail) > 2000


def test_live_and_resumed_spending_are_the_same_figure(tmp_path: Path) -> None:
    """`spent` is defined once: the allowed spend records. A campaign's live ledger (what campaign.end reports)
    and the one a resume reads back agree, also after a spend the policy denied."""
    from agent.errors import BudgetExhausted
    from agent.gatekeeper import Gatekeeper
    from policies import load_policy
    from policies.model import Policy

    log, w = _log(tmp_path)
    policy = load_policy(Path(__file__).resolve().parents[2] / "policies" / "default.yaml")
    assert isinstance(policy, Policy)
    limit = policy.budget["llm_tokens"]
    gate = Gatekeeper(policy=policy, writer=w, root=tmp_path, limits={})
    gate.spend("llm_tokens", 100, iteration=1)
    with pytest.raises(BudgetExhausted):
        gate.spend("llm_tokens", limit, iteration=1)      # over the policy's budget: denied
    w.close()
    assert gate.spent == read_journal(log).spent == {"llm_tokens": 100.0}


def test_a_kernel_logs_prelude_ending_so_far_and_last_round_come_back(tmp_path: Path) -> None:
    """A kernel campaign's journal (agent/kernel_resume.py): the kept prelude is the incumbent until an accept, the
    steps of its ending already recorded are there, the last round's wall seconds are what the loop plans with."""
    log = tmp_path / "log"
    w = AuditWriter.open(log, campaign="k-1", key_path=tmp_path / "key", anchor_dir=tmp_path / "anchors")
    w.append("campaign.start", payload={"spec_path": "/k.yaml", "spec": {"name": "k"}, "workspace": "/ws",
                                        "branch": "ratchet/k-1", "proposer": "kernel-search", "base_commit": "b0",
                                        "kind": "kernel", "tunables": {"BLOCK": 64}})
    w.append("baseline.result", iteration=0, payload={"shapes": {"decode": {"median_us": 3.0}}, "ref": "b0"})
    w.append("prelude.result", iteration=0, payload={"kept": True, "commit": "p1", "tunables": {"BLOCK": 64, "W": 0}})

    def wall(seconds: float, iteration: int) -> None:
        w.append("action", iteration=iteration, decision="allow", rule="r", payload={
            "action": {"kind": "spend", "resource": "wall_seconds", "amount": seconds}})

    wall(5.0, 0)                                 # baseline and prelude: not a round
    w.append("iteration.hypothesis", iteration=1, payload={"hypothesis": "W 1", "source": "kernel-search:W=1"})
    w.append("iteration.result", iteration=1, payload={"outcome": "rejected", "accepted": False, "reason": "slower"})
    wall(7.0, 1)
    j = read_journal(log)
    assert (j.kind, j.incumbent_ref, j.last_round_s, j.spent) == ("kernel", "p1", 7.0, {"wall_seconds": 12.0})
    assert (j.final, j.final_failed, j.served, j.incumbent_rows) == (None, False, None, [])
    w.append("iteration.hypothesis", iteration=2, payload={"hypothesis": "W 2", "source": "kernel-search:W=2"})
    w.append("iteration.result", iteration=2, payload={"outcome": "accepted", "accepted": True, "commit": "c2",
                                                       "reason": "faster"})
    wall(6.0, 2)
    w.append("final.result", iteration=3, payload={"outcome": "accepted", "best_ref": "c2"})
    w.close()
    j = read_journal(log)
    assert (j.incumbent_ref, j.last_round_s, j.final, j.ended) == ("c2", 6.0, {"outcome": "accepted",
                                                                               "best_ref": "c2"}, False)
    assert [h.outcome for h in j.history] == ["rejected", "accepted"] and j.prelude is not None


def test_the_latest_profile_comes_back_with_its_step_table_and_an_older_log_without_one(tmp_path: Path) -> None:
    log, w = _log(tmp_path)
    w.append("baseline.profile", iteration=0, payload={"cell": "in8/out4", "text": "old ops", "incumbent": "b0"})
    w.close()
    j = read_journal(log)
    assert j.profile == "old ops" and j.profile_steps == {}          # logged before the step table existed
    log, w = _log(tmp_path / "new")
    w.append("baseline.profile", iteration=0, payload={"cell": "in8/out4", "text": "ops", "incumbent": "b0",
                                                       "steps": {"decode": {"wall": 9000.0, "GPU idle": 900.0}}})
    w.close()
    assert read_journal(log).profile_steps == {"decode": {"wall": 9000.0, "GPU idle": 900.0}}
