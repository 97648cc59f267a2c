"""Exceptions the sandbox raises on purpose.

    SandboxError
     ├── BackendUnavailable   the backend cannot run here (dockerd down, image absent, no unshare)
     ├── LaunchFailed         the process or container did not start
     └── WorkspaceError       a workspace could not be created or a patch not applied
          └── PatchRejected   the patch is unsafe or does not apply (path, symlink, binary, mode)
"""

from __future__ import annotations

__all__ = ["SandboxError", "BackendUnavailable", "LaunchFailed", "WorkspaceError", "PatchRejected"]


class SandboxError(Exception):
    """Base for failures the sandbox raises on purpose."""


class BackendUnavailable(SandboxError):
    pass


class LaunchFailed(SandboxError):
    pass


class WorkspaceError(SandboxError):
    pass


class PatchRejected(WorkspaceError):
    pass
