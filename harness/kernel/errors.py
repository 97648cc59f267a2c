"""Exceptions of the kernel harness. A kernel that fails a check is a value (CheckResult), not one of these.

    HarnessError (harness/errors.py)
     └── KernelHarnessError
          └── KernelRunnerError   the runner process crashed, timed out or wrote no result
"""

from __future__ import annotations

from harness.errors import HarnessError

__all__ = ["KernelHarnessError", "KernelRunnerError"]


class KernelHarnessError(HarnessError):
    pass


class KernelRunnerError(KernelHarnessError):
    pass
