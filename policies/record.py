"""What the audit log stores about a decision, and re-deciding it offline from the log.

The campaign loop writes one record per action with `decision`/`rule`/`policy_sha256` set and
payload `{"action": ..., "ledger": ..., "reason": ..., "resolved": ...}` (see audit/README.md).
The symlink facts the live workspace reported are kept in the ledger snapshot, so `redecide` is
pure and reproduces the gate's verdict without the workspace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from policies.actions import Action, Patch, ReadFile, WriteFile, action_json, parse_action
from policies.base import Decision, Ledger, StaticWorkspace
from policies.diffparse import parse_patch
from policies.errors import PolicyError
from policies.gate import decide
from policies.model import Policy, policy_sha256
from policies.paths import normalize_path

__all__ = ["action_payload", "ledger_from_snapshot", "redecider", "symlink_facts"]


def _paths(action: Action) -> list[str]:
    if isinstance(action, ReadFile | WriteFile):
        return [action.path]
    if isinstance(action, Patch):
        try:
            return list(parse_patch(action.diff).paths)
        except PolicyError:
            return []
    return []


def symlink_facts(action: Action, ledger: Ledger) -> list[str]:
    """The symlinked components the ledger's workspace reports for the action's paths."""
    if ledger.workspace is None:
        return []
    found: list[str] = []
    for raw in _paths(action):
        try:
            link = ledger.workspace.symlink_in(normalize_path(raw))
        except PolicyError:
            continue
        if link is not None and link not in found:
            found.append(link)
    return found


def action_payload(
    action: Action, ledger: Ledger, *, decision: Decision, resolved: Decision | None = None
) -> dict[str, Any]:
    """The payload of a decision record: enough to re-decide it offline."""
    payload: dict[str, Any] = {
        "action": action_json(action),
        "ledger": {
            "spent": dict(sorted(ledger.spent.items())),
            "gpus_in_use": ledger.gpus_in_use,
            "symlinks": symlink_facts(action, ledger),
        },
        "reason": decision.reason,
    }
    if resolved is not None:
        payload["resolved"] = {"decision": resolved.verdict, "reason": resolved.reason}
    return payload


def ledger_from_snapshot(snapshot: Mapping[str, Any]) -> Ledger:
    spent = {str(key): float(value) for key, value in dict(snapshot.get("spent", {})).items()}
    links = frozenset(str(link) for link in snapshot.get("symlinks", []))
    return Ledger(
        spent=spent, gpus_in_use=int(snapshot.get("gpus_in_use", 0)), workspace=StaticWorkspace(links)
    )


def redecider(policies: Iterable[Policy]) -> Callable[[Mapping[str, Any]], str | None]:
    """A `redecide(record)` callback for audit.verify: None for records that carry no decision;
    raises LookupError when the record's policy hash matches none of `policies` (a forged policy)
    or when a decision record carries no action to re-decide."""
    by_hash = {policy_sha256(policy): policy for policy in policies}

    def redecide(record: Mapping[str, Any]) -> str | None:
        if "decision" not in record:
            return None
        payload = record.get("payload")
        if not isinstance(payload, Mapping) or "action" not in payload:
            raise LookupError("a decision record without an action payload cannot be re-decided")
        recorded = record.get("policy_sha256")
        policy = by_hash.get(str(recorded))
        if policy is None:
            raise LookupError(f"policy_sha256 {recorded} matches no known policy (forged or not supplied)")
        action = parse_action(dict(payload["action"]))
        return decide(policy, action, ledger_from_snapshot(payload.get("ledger", {}))).verdict

    return redecide
