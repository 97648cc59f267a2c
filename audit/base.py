"""Records of the audit package: what an append returns, what verify returns, record kinds."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BLOB_THRESHOLD",
    "KIND_CHECKPOINT",
    "KIND_EVIDENCE",
    "KIND_ITERATION_RESULT",
    "KIND_OPEN",
    "KIND_RECOVERY",
    "Anchor",
    "Appended",
    "Redecide",
    "VerifyResult",
]

KIND_OPEN = "log.open"
KIND_CHECKPOINT = "checkpoint"
KIND_RECOVERY = "recovery"
KIND_ITERATION_RESULT = "iteration.result"
KIND_EVIDENCE = "evidence"  # a step's files beside the log, bound by sha256 and size (audit/evidence.py)
BLOB_THRESHOLD = 64 * 1024  # canonical payloads larger than this go to blobs/sha256/<hex>

# verify() calls this for every record; it returns the decision the policy gives now, or None to skip.
Redecide = Callable[[Mapping[str, Any]], "str | None"]


@dataclass(frozen=True)
class Appended:
    """One record as written: its seq and the sha256 of its line bytes (newline included)."""

    seq: int
    sha256: str


@dataclass(frozen=True)
class Anchor:
    """The last signed checkpoint, kept outside the log (next to the key) to detect tail cuts."""

    campaign: str
    seq: int
    sha256: str
    key_id: str
    signature: str


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    records: int  # lines read (all of them when ok)
    bad_seq: int | None = None
    reason: str = ""
    campaign: str | None = None
    checkpoints: int = 0
    key_source: str = ""
    notes: tuple[str, ...] = ()
    evidence_files: int = 0  # files checked against the log's evidence manifests (0: none bound)
    evidence_records: int = 0  # the manifests (`evidence` records) they were bound by
    evidence_problems: tuple[str, ...] = ()  # every bound file that is missing, changed or a symlink now

    def summary(self) -> str:
        if self.ok:
            files = f", {self.evidence_files} evidence files" if self.evidence_records else ""
            return f"verified {self.records} records{files}"
        return f"FAILED at seq {self.bad_seq}: {self.reason}"
