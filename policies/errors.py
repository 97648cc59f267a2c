"""The one exception tree of `policies`.

    PolicyError                 base: something the gate refused to read or understand
    ├── PolicyLoadError         a policy file is missing, not YAML, or fails its schema
    ├── ActionError             an action JSON fails its schema
    ├── PathRejected            a path is malformed (absolute, NUL, backslash, escapes the root...)
    ├── PatchRejected           a diff cannot be parsed or carries a forbidden header (mode, binary...)
    └── ApprovalsError          an approvals file is missing or malformed

`decide()` never raises: every exception inside it becomes a deny decision.
"""

from __future__ import annotations

__all__ = [
    "ActionError",
    "ApprovalsError",
    "PatchRejected",
    "PathRejected",
    "PolicyError",
    "PolicyLoadError",
]


class PolicyError(Exception):
    """Base for failures the policy package raises on purpose."""


class PolicyLoadError(PolicyError):
    """A policy file could not be loaded or validated; the message names the file and field path."""


class ActionError(PolicyError):
    """An action document could not be validated; the message names the field path."""


class PathRejected(PolicyError):
    """A path is malformed or escapes the workspace root."""


class PatchRejected(PolicyError):
    """A unified diff could not be parsed or carries something the gate never allows."""


class ApprovalsError(PolicyError):
    """An approvals file could not be loaded or validated."""
