"""Records and protocols of the policy gate: `Decision`, `Ledger`, `Workspace`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

__all__ = ["DEFAULT_DENY", "ERROR_RULE", "Decision", "Ledger", "StaticWorkspace", "Verdict", "Workspace"]

Verdict = Literal["allow", "deny", "ask"]

DEFAULT_DENY = "default-deny"  # rule id when no rule matched
ERROR_RULE = "error"  # rule id when decide() caught an exception


@dataclass(frozen=True)
class Decision:
    """What the gate decided for one action, which rule decided it, and why."""

    verdict: Verdict
    rule: str
    reason: str

    def as_json(self) -> dict[str, str]:
        return {"decision": self.verdict, "rule": self.rule, "reason": self.reason}


class Workspace(Protocol):
    """The gate's only view of the filesystem (see policies/fs.py for the real one)."""

    def symlink_in(self, parts: tuple[str, ...]) -> str | None:
        """Return the first existing component of `parts` (joined with '/') that is a symlink, if any."""
        ...


@dataclass(frozen=True)
class StaticWorkspace:
    """A workspace described by the set of its symlinked paths (tests, offline re-decision)."""

    symlinks: frozenset[str] = frozenset()

    def symlink_in(self, parts: tuple[str, ...]) -> str | None:
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if prefix in self.symlinks:
                return prefix
        return None


@dataclass(frozen=True)
class Ledger:
    """What was spent so far and how to look at the workspace.

    `spent` maps a budget resource (llm_tokens, llm_usd, wall_seconds, gpu_minutes, trials) to the amount
    already used; `gpus_in_use` counts devices held now. `workspace` is None when no root is given
    (then no symlink check happens; the CLI always passes one when --root is set).
    """

    spent: Mapping[str, float] = field(default_factory=dict)
    gpus_in_use: int = 0
    workspace: Workspace | None = None
