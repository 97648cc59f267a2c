"""The loop's one door to the policy gate: decide, resolve `ask`, write the decision to the audit log
(fsynced) and only then let the caller act. Also keeps the budget ledger."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import records
from agent.errors import ActionDenied, BudgetExhausted
from audit import AuditWriter
from policies import (
    Decision,
    FsWorkspace,
    Ledger,
    Policy,
    decide,
    load_approvals,
    parse_action,
    policy_sha256,
    resolve_ask,
    tty_prompt,
)
from policies.record import action_payload

__all__ = ["Gatekeeper"]


@dataclass
class Gatekeeper:
    policy: Policy
    writer: AuditWriter
    root: Path                                  # the workspace tree paths are checked against
    spent: dict[str, float] = field(default_factory=dict)
    limits: Mapping[str, float] = field(default_factory=dict)   # the spec's budget (the policy has its own)
    approvals_path: Path | None = None
    _count: int = 0

    @property
    def policy_sha256(self) -> str:
        return policy_sha256(self.policy)

    def ledger(self) -> Ledger:
        return Ledger(spent=dict(self.spent), workspace=FsWorkspace(self.root))

    def request(self, action: Mapping[str, Any], *, iteration: int | None) -> Decision:
        """Decide and record; return the final (ask-resolved) decision. Raises nothing for a deny."""
        self._count += 1
        data = dict(action)
        data.setdefault("id", f"it{iteration if iteration is not None else 'x'}.a{self._count}")
        parsed = parse_action(data)
        ledger = self.ledger()
        decision = decide(self.policy, parsed, ledger)
        resolved = None
        if decision.verdict == "ask":
            approvals = load_approvals(self.approvals_path) if self.approvals_path else None
            resolved = resolve_ask(decision, parsed, policy_sha256=self.policy_sha256, env=os.environ,
                                   approvals=approvals, prompt=tty_prompt())
        self.writer.append(records.ACTION, payload=action_payload(parsed, ledger, decision=decision, resolved=resolved),
                           iteration=iteration, action_id=str(data["id"]), decision=decision.verdict,
                           rule=decision.rule, policy_sha256=self.policy_sha256)
        return resolved or decision

    def require(self, action: Mapping[str, Any], *, iteration: int | None) -> Decision:
        decision = self.request(action, iteration=iteration)
        if decision.verdict != "allow":
            raise ActionDenied(decision.rule, decision.reason)
        return decision

    def left(self, resource: str) -> float:
        limit = self.limits.get(resource)
        return float("inf") if limit is None else max(0.0, float(limit) - self.spent.get(resource, 0.0))

    def spend(self, resource: str, amount: float, *, iteration: int | None) -> None:
        """Record spending that happened (LLM tokens, wall time). Over either budget: BudgetExhausted.
        `spent` is the granted spending: the sum of the allowed spend records, which is also what a resume
        reads back (agent/journal.py); a denied one stays in the log with its amount and ends the campaign."""
        if amount <= 0:
            return
        decision = self.request({"kind": "spend", "resource": resource, "amount": float(amount)}, iteration=iteration)
        if decision.verdict != "allow":
            raise BudgetExhausted(f"{resource}: policy budget exhausted ({decision.reason})")
        self.spent[resource] = self.spent.get(resource, 0.0) + float(amount)
        if self.left(resource) <= 0:
            raise BudgetExhausted(f"{resource}: campaign budget of {self.limits.get(resource)} exhausted")

    def reserve(self, resource: str, amount: float, *, iteration: int | None) -> None:
        """Spend before acting, for a resource whose end refuses one tool rather than stopping the campaign
        (try_patch's trials): beyond the spec's budget or the policy's, ActionDenied and nothing spent."""
        if self.left(resource) < amount:
            raise ActionDenied("budget-limit", f"{resource}: the campaign's budget of {self.limits.get(resource):g} "
                                               "is used up")
        self.require({"kind": "spend", "resource": resource, "amount": float(amount)}, iteration=iteration)
        self.spent[resource] = self.spent.get(resource, 0.0) + float(amount)
