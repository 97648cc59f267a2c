"""Resolving an `ask` decision outside the pure gate: CI, an approvals file, or a human on a TTY.

Order: a decision that is not `ask` passes through unchanged; when env CI is set (non-empty) ask is a
deny, whatever else is configured; an approvals file entry with the action's digest (and, if the
entry names one, the same policy hash) allows; a TTY prompt answered 'y'/'yes' allows; anything else
denies. The gate's own verdict stays `ask`: record it as the decision and the resolution beside it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from policies.actions import Action, action_digest
from policies.base import Decision
from policies.errors import ApprovalsError
from policies.model import format_validation_error

__all__ = ["Approvals", "load_approvals", "resolve_ask", "tty_prompt"]

Prompt = Callable[[str], str]
_Hex64 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class _Entry(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    digest: _Hex64
    policy_sha256: _Hex64 | None = None
    note: str = ""


class _ApprovalsFile(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    schema_version: Literal[1]
    approved: list[_Entry]


@dataclass(frozen=True)
class Approvals:
    """Approved (action digest, policy hash or None for any policy) pairs."""

    entries: frozenset[tuple[str, str | None]]

    def approves(self, digest: str, policy_sha256: str) -> bool:
        return (digest, None) in self.entries or (digest, policy_sha256) in self.entries


def load_approvals(path: Path) -> Approvals:
    """Load a YAML/JSON approvals file: {schema_version: 1, approved: [{digest, policy_sha256?, note?}]}."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise ApprovalsError(f"{path}: cannot read approvals file: {error}") from None
    try:
        parsed = _ApprovalsFile.model_validate(data)
    except ValidationError as error:
        raise ApprovalsError(format_validation_error(str(path), error)) from None
    return Approvals(frozenset((entry.digest, entry.policy_sha256) for entry in parsed.approved))


def tty_prompt() -> Prompt | None:
    """A prompt on the controlling terminal, or None when stdin/stderr is not a TTY."""
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return None

    def prompt(question: str) -> str:
        sys.stderr.write(question)
        sys.stderr.flush()
        return sys.stdin.readline()

    return prompt


def resolve_ask(
    decision: Decision,
    action: Action,
    *,
    policy_sha256: str,
    env: Mapping[str, str],
    approvals: Approvals | None = None,
    prompt: Prompt | None = None,
) -> Decision:
    """Turn `ask` into allow or deny (see the module docstring for the order)."""
    if decision.verdict != "ask":
        return decision
    digest = action_digest(action)
    if env.get("CI", ""):
        return Decision("deny", decision.rule, f"ask under CI is a deny ({decision.reason}); digest {digest}")
    if approvals is not None and approvals.approves(digest, policy_sha256):
        return Decision("allow", decision.rule, f"approved in approvals file (digest {digest})")
    if prompt is None:
        return Decision("deny", decision.rule, f"ask with no TTY and no approval; approve digest {digest}")
    question = (
        f"ratchet policy asks: {decision.reason}\n  action {action.kind} digest {digest}\n  allow? [y/N] "
    )
    answer = prompt(question).strip().lower()
    if answer in ("y", "yes"):
        return Decision("allow", decision.rule, "approved on the terminal")
    return Decision("deny", decision.rule, "refused on the terminal")
