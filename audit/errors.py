"""The one exception tree of `audit`.

    AuditError              base: the log could not be written, opened or read as asked
    ├── AuditWriteError     an append/fsync/blob write failed: the campaign must stop
    ├── LogLockedError      another writer holds <dir>/log.lock
    ├── LogFormatError      an existing log cannot be continued (wrong campaign, broken head)
    ├── AuditKeyError       the signing key or a public key is missing, unsafe or mismatched
    └── EvidenceError       a file cannot be bound as evidence (unsafe path, symlink, not a regular file, missing)

`verify()` does not raise for a bad log: it returns a VerifyResult naming the first bad seq.
"""

from __future__ import annotations

__all__ = ["AuditError", "AuditKeyError", "AuditWriteError", "EvidenceError", "LogFormatError", "LogLockedError"]


class AuditError(Exception):
    """Base for failures the audit package raises on purpose."""


class AuditWriteError(AuditError):
    """Writing the log failed; the action it describes must not run."""


class LogLockedError(AuditError):
    """Another process holds the writer lock of this log directory."""


class LogFormatError(AuditError):
    """An existing log cannot be continued."""


class AuditKeyError(AuditError):
    """A signing or verification key is missing, unsafe, or does not match the log."""


class EvidenceError(AuditError):
    """A file cannot be bound to the log as evidence: its path is unsafe, it is (or passes through) a symlink, it is
    not a regular file, or it is not there."""
