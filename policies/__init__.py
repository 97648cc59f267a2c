"""The policy gate: policy files, actions, the pure `decide()`, and ask resolution.

Public API (see policies/README.md):
    load_policy(path) -> Policy; policy_sha256(policy) -> str
    parse_action(json) -> Action; action_digest(action) -> str
    decide(policy, action, ledger) -> Decision
    resolve_ask(decision, action, *, policy_sha256, env, approvals=None, prompt=None) -> Decision
"""

from __future__ import annotations

from policies.actions import Action, action_digest, action_json, parse_action
from policies.ask import Approvals, load_approvals, resolve_ask, tty_prompt
from policies.base import Decision, Ledger, StaticWorkspace, Workspace
from policies.errors import PolicyError
from policies.fs import FsWorkspace
from policies.gate import decide
from policies.model import Policy, load_policy, policy_sha256
from policies.record import action_payload, redecider

__all__ = [
    "Action",
    "Approvals",
    "Decision",
    "FsWorkspace",
    "Ledger",
    "Policy",
    "PolicyError",
    "StaticWorkspace",
    "Workspace",
    "action_digest",
    "action_json",
    "action_payload",
    "decide",
    "load_approvals",
    "load_policy",
    "parse_action",
    "policy_sha256",
    "redecider",
    "resolve_ask",
    "tty_prompt",
]
