"""The log's JSON schema (pydantic, strict, unknown keys rejected) and the payloads verify/report read.

Every line of log.jsonl is one `LogRecord` in RFC 8785 canonical form followed by '\n'.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "CAMPAIGN_ID",
    "CheckpointPayload",
    "EvidencePayload",
    "IterationResult",
    "LogRecord",
    "RecoveryPayload",
]

CAMPAIGN_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
Hex64 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class LogRecord(_Strict):
    v: Literal[1]
    seq: int = Field(ge=0)
    prev: Hex64
    campaign: Annotated[str, Field(pattern=CAMPAIGN_ID)]
    iteration: int | None
    action_id: str | None
    kind: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_.-]{0,63}$")]
    payload: dict[str, Any] | None = None
    payload_sha256: Hex64 | None = None
    payload_size: int | None = Field(default=None, ge=0)
    decision: Literal["allow", "deny", "ask"] | None = None
    rule: str | None = None
    policy_sha256: Hex64 | None = None
    ts: Annotated[str, Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z$")]

    @model_validator(mode="after")
    def _one_payload(self) -> LogRecord:
        if (self.payload is None) == (self.payload_sha256 is None):
            raise ValueError("exactly one of payload and payload_sha256 must be present")
        if (self.payload_sha256 is None) != (self.payload_size is None):
            raise ValueError("payload_size goes with payload_sha256")
        return self


class CheckpointPayload(_Strict):
    """kind=checkpoint: an Ed25519 signature over (campaign, covers_seq, covers_sha256)."""

    covers_seq: int = Field(ge=-1)  # the record before this checkpoint (-1: empty log, genesis)
    covers_sha256: Hex64  # sha256 of that record's line bytes (the genesis value for -1)
    key_id: Hex64  # sha256 of the raw Ed25519 public key
    signature: str  # base64


class RecoveryPayload(_Strict):
    """kind=recovery: a crash-torn tail was moved aside (never rewritten) before appending."""

    torn_file: str  # file name inside the log dir, log.jsonl.torn-<n>
    torn_offset: int = Field(ge=0)  # byte offset in log.jsonl where the torn bytes began
    torn_size: int = Field(ge=1)
    torn_sha256: Hex64


class EvidenceFile(_Strict):
    sha256: Hex64
    size: int = Field(ge=0)


class EvidencePayload(BaseModel):
    """kind=evidence: one step's files beside the log (paths relative to its folder), by sha256 and size. Extra keys
    (which iterations, which folder) are the writer's and allowed."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    step: str
    files: dict[str, EvidenceFile]


class IterationResult(BaseModel):
    """kind=iteration.result: one verified candidate. Extra keys are allowed and ignored by the report."""

    model_config = ConfigDict(strict=False, extra="allow", frozen=True)

    accepted: bool
    parity_ok: bool
    throughput_tok_s: float | None = None  # candidate throughput (tokens/s), median over the grid
    incumbent_tok_s: float | None = None
    speedup: float | None = None  # candidate / incumbent, point estimate
    ci_low: float | None = None  # bootstrap confidence interval of the speedup
    ci_high: float | None = None
    reason: str = ""  # why accepted/rejected, e.g. "parity flip at prompt 7"
    commit: str | None = None  # the accepted commit
