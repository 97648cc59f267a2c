"""Tamper-evident audit log: hash-chained canonical JSON lines, signed checkpoints, verify, report.

A leaf package: imports only the stdlib, pydantic, structlog, rfc8785, cryptography and rich.
Public API (see audit/README.md):
    AuditWriter.open(dir, *, campaign, key_path=None, anchor_dir=None) -> AuditWriter
        .append(kind, *, payload, iteration, action_id, decision, rule, policy_sha256) -> Appended
        .checkpoint() -> Appended; .close(checkpoint=True)
    verify(dir, *, pubkey=None, redecide=None, anchor=None, expect_seq=None, open_tail=False) -> VerifyResult
    append_evidence(writer, paths, *, step, iteration=None, **fields) -> Appended | None
    show(dir); write_report(dir) -> (report.html, summary.md)
"""

from __future__ import annotations

from audit.base import Anchor, Appended, Redecide, VerifyResult
from audit.errors import AuditError, AuditKeyError, AuditWriteError, EvidenceError, LogFormatError, LogLockedError
from audit.evidence import append_evidence
from audit.keys import anchor_path, default_anchor_dir, default_key_path
from audit.report import write_report
from audit.show import show
from audit.verify import verify
from audit.writer import AuditWriter

__all__ = [
    "Anchor",
    "Appended",
    "AuditError",
    "AuditKeyError",
    "AuditWriteError",
    "AuditWriter",
    "EvidenceError",
    "LogFormatError",
    "LogLockedError",
    "Redecide",
    "VerifyResult",
    "anchor_path",
    "append_evidence",
    "default_anchor_dir",
    "default_key_path",
    "show",
    "verify",
    "write_report",
]
