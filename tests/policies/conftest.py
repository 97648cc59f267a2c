"""Fixtures for the policy gate tests: the shipped policy files and small action builders."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from policies import Decision, Ledger, Policy, decide, load_policy, parse_action

POLICY_DIR = Path(__file__).resolve().parents[2] / "policies"

Decider = Callable[..., Decision]


@pytest.fixture(scope="session")
def default_policy() -> Policy:
    return load_policy(POLICY_DIR / "default.yaml")


@pytest.fixture(scope="session")
def ask_policy() -> Policy:
    return load_policy(POLICY_DIR / "ask-example.yaml")


@pytest.fixture
def check(default_policy: Policy) -> Decider:
    """check(action_dict, ledger=None, policy=None) -> Decision, validating the action from JSON."""

    def run(action: dict[str, Any], ledger: Ledger | None = None, policy: Policy | None = None) -> Decision:
        import json

        parsed = parse_action(json.dumps(action))
        return decide(policy or default_policy, parsed, ledger or Ledger())

    return run


def unified(path: str, added: list[str], *, old: str | None = None, header: str = "") -> str:
    """A git-style diff modifying `path` (or renaming `old` to `path`) with one hunk."""
    source = old or path
    body = "".join(f"+{line}\n" for line in added)
    return (
        f"diff --git a/{source} b/{path}\n{header}"
        f"--- a/{source}\n+++ b/{path}\n"
        f"@@ -1,1 +1,{1 + len(added)} @@\n context\n{body}"
    )


@pytest.fixture
def diff() -> Callable[..., str]:
    return unified
