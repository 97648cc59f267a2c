"""`verify(dir)`: canonical lines, seq from 0 without gaps, prev links, signatures, tail coverage,
blobs, re-decisions, (with an anchor or --expect-seq) truncation of whole checkpoints, and then every file an
`evidence` record bound (audit/evidence.py): still there, still a regular file reached through no symlink, and
with the sha256 and size it was bound with.

What cannot be detected without an external anchor: cutting the log right after an earlier
checkpoint (removing every later record *and* the later checkpoints) leaves a valid, signed prefix.
The writer therefore keeps the last signed (seq, sha256) next to the key (anchors/<campaign>.json,
outside the sandbox); pass it as `anchor`, or pass the final seq a reviewer knows as `expect_seq`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import ValidationError

from audit.base import KIND_CHECKPOINT, KIND_EVIDENCE, KIND_RECOVERY, Anchor, Redecide, VerifyResult
from audit.blobs import blob_path, check_blob
from audit.canon import genesis, parse_line, sha256_hex
from audit.errors import AuditKeyError
from audit.evidence import evidence_problems, path_problem
from audit.keys import PUBKEY_NAME, key_id, load_public_key, read_anchor, signed_message, verify_signature
from audit.schema import CheckpointPayload, EvidencePayload, LogRecord, RecoveryPayload
from audit.writer import LOG_NAME

__all__ = ["NO_EVIDENCE_NOTE", "verify"]

NO_EVIDENCE_NOTE = (
    "no evidence bound: the log has no evidence records (written before they existed), so the files beside it "
    "(raw benchmark results, prompts, server logs, the parity reference) are not checked"
)


class _Bad(Exception):
    def __init__(self, seq: int | None, reason: str, *, evidence: tuple[str, ...] = ()) -> None:
        super().__init__(reason)
        self.seq = seq
        self.reason = reason
        self.evidence = evidence  # every evidence file that differs, when that is the problem


def _lines(data: bytes) -> Iterator[bytes]:
    start = 0
    while start < len(data):
        end = data.index(b"\n", start) + 1
        yield data[start:end]
        start = end


def _check_checkpoint(record: LogRecord, prev_hash: str, key: Ed25519PublicKey) -> None:
    try:
        body = CheckpointPayload.model_validate(record.payload)
    except ValidationError as error:
        raise _Bad(record.seq, f"checkpoint payload malformed: {error.errors()[0]['msg']}") from None
    if body.covers_seq != record.seq - 1 or body.covers_sha256 != prev_hash:
        raise _Bad(record.seq, "checkpoint does not cover the record before it")
    if body.key_id != key_id(key):
        raise _Bad(record.seq, "checkpoint was signed by a different key than the verification key")
    message = signed_message(
        purpose="checkpoint", campaign=record.campaign, seq=body.covers_seq, sha256=body.covers_sha256
    )
    if not verify_signature(key, message, body.signature):
        raise _Bad(record.seq, "checkpoint signature does not verify: records before it were changed")


def _check_recovery(directory: Path, record: LogRecord) -> None:
    try:
        body = RecoveryPayload.model_validate(record.payload)
    except ValidationError as error:
        raise _Bad(record.seq, f"recovery payload malformed: {error.errors()[0]['msg']}") from None
    path = directory / body.torn_file
    if path.name != body.torn_file or not path.is_file() or sha256_hex(path.read_bytes()) != body.torn_sha256:
        raise _Bad(record.seq, f"torn tail {body.torn_file} is missing or changed")


def _evidence(directory: Path, record: LogRecord) -> EvidencePayload:
    """An evidence record's manifest, its paths checked (the files themselves are checked once the log is)."""
    body = record.payload
    if record.payload_sha256 is not None:  # already checked against its digest
        body = json.loads(blob_path(directory, record.payload_sha256).read_bytes())
    try:
        manifest = EvidencePayload.model_validate(body)
    except ValidationError as error:
        raise _Bad(record.seq, f"evidence payload malformed: {error.errors()[0]['msg']}") from None
    for rel in manifest.files:
        problem = path_problem(rel)
        if problem:
            raise _Bad(record.seq, f"evidence path {rel!r} {problem}")
    return manifest


def _check_evidence(directory: Path, manifests: list[tuple[int, EvidencePayload]]) -> tuple[int, list[tuple[int, str]]]:
    """Every bound file as its manifest says, in log order: (distinct files checked, [(seq, problem)] for each one
    that is not). All of them, not only the first: the report names every file that differs."""
    problems: list[tuple[int, str]] = []
    for seq, manifest in manifests:
        files = {rel: entry.model_dump() for rel, entry in manifest.files.items()}
        problems += [(seq, f"{text}; bound by record {seq} (step {manifest.step})")
                     for text in evidence_problems(directory, files)]
    return len({rel for _, manifest in manifests for rel in manifest.files}), problems


def _check_record(directory: Path, raw: bytes, index: int, campaign: str | None) -> LogRecord:
    try:
        obj = parse_line(raw[:-1])
        record = LogRecord.model_validate(obj)
    except (ValueError, UnicodeDecodeError) as error:
        raise _Bad(index, f"line {index + 1} is not a canonical JSON record: {error}") from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "<record>"
        raise _Bad(index, f"line {index + 1} fails the log schema at {where}: {first['msg']}") from None
    if record.seq != index:
        raise _Bad(
            index, f"line {index + 1} carries seq {record.seq}: records were removed, duplicated or reordered"
        )
    if campaign is not None and record.campaign != campaign:
        raise _Bad(index, f"record belongs to campaign {record.campaign!r}, not {campaign!r}: spliced")
    if record.payload_sha256 is not None:
        problem = check_blob(directory, record.payload_sha256, record.payload_size)
        if problem:
            raise _Bad(index, problem)
    return record


def _redecide(directory: Path, redecide: Redecide, raw: bytes, record: LogRecord) -> None:
    obj = parse_line(raw[:-1])
    if record.payload_sha256 is not None:  # already checked against its digest
        obj["payload"] = json.loads(blob_path(directory, record.payload_sha256).read_bytes())
    try:
        again = redecide(obj)
    except Exception as error:  # noqa: BLE001 - the callback's failure is the finding
        raise _Bad(record.seq, f"re-decision failed: {error}") from None
    if again is not None and again != record.decision:
        raise _Bad(record.seq, f"recorded decision {record.decision!r} but the policy decides {again!r}")


def _check_anchor(anchor: Anchor, hashes: list[str], campaign: str, key: Ed25519PublicKey) -> None:
    if anchor.campaign != campaign:
        raise _Bad(None, f"anchor is for campaign {anchor.campaign!r}, log is {campaign!r}")
    message = signed_message(purpose="anchor", campaign=anchor.campaign, seq=anchor.seq, sha256=anchor.sha256)
    if anchor.key_id != key_id(key) or not verify_signature(key, message, anchor.signature):
        raise _Bad(None, "anchor signature does not verify with the verification key")
    if anchor.seq >= len(hashes):
        raise _Bad(
            len(hashes),
            f"log ends at seq {len(hashes) - 1} but checkpoint seq {anchor.seq} was signed: truncated",
        )
    if hashes[anchor.seq] != anchor.sha256:
        raise _Bad(anchor.seq, "record at the anchored seq differs from the signed checkpoint: rewritten")


def _load_key(directory: Path, pubkey: Path | None) -> tuple[Ed25519PublicKey, str]:
    if pubkey is not None:
        return load_public_key(pubkey), f"given public key {pubkey}"
    own = directory / PUBKEY_NAME
    return load_public_key(own), f"the log's own {own.name} (not independent: pass --pubkey)"


def _walk(
    directory: Path, data: bytes, key: Ed25519PublicKey, redecide: Redecide | None, *, open_tail: bool
) -> tuple[str, list[str], int, list[tuple[int, EvidencePayload]]]:
    campaign: str | None = None
    hashes: list[str] = []
    checkpoints = 0
    manifests: list[tuple[int, EvidencePayload]] = []
    record: LogRecord | None = None
    for index, raw in enumerate(_lines(data)):
        record = _check_record(directory, raw, index, campaign)
        campaign = record.campaign
        expected = genesis(campaign) if index == 0 else hashes[-1]
        if record.prev != expected:
            if index == 0:
                raise _Bad(0, "first record's prev is not this campaign's genesis: spliced or truncated head")
            raise _Bad(
                index - 1,
                f"record {index - 1} was changed: its sha256 does not match prev of record {index}",
            )
        if record.kind == KIND_CHECKPOINT:
            _check_checkpoint(record, expected, key)
            checkpoints += 1
        elif record.kind == KIND_RECOVERY:
            _check_recovery(directory, record)
        elif record.kind == KIND_EVIDENCE:
            manifests.append((record.seq, _evidence(directory, record)))
        if redecide is not None:
            _redecide(directory, redecide, raw, record)
        hashes.append(sha256_hex(raw))
    if record is None or campaign is None:
        raise _Bad(None, f"{directory / LOG_NAME} holds no records")
    if record.kind != KIND_CHECKPOINT and not open_tail:
        raise _Bad(record.seq, "tail not covered by a checkpoint: possible truncation")
    return campaign, hashes, checkpoints, manifests


def verify(
    directory: Path,
    *,
    pubkey: Path | None = None,
    redecide: Redecide | None = None,
    anchor: Path | None = None,
    expect_seq: int | None = None,
    open_tail: bool = False,
) -> VerifyResult:
    """Verify `directory`/log.jsonl; the first problem found is reported with its seq.

    `open_tail`: the log of a writer that was killed, as a resume reads it before it writes again: the records
    after its last checkpoint (still chained, not yet signed) and a torn last line (which the writer moves aside
    when it reopens the log) are allowed; every other check holds. A finished log never needs it."""
    try:
        key, source = _load_key(directory, pubkey)
    except AuditKeyError as error:
        return VerifyResult(ok=False, records=0, reason=str(error))
    try:
        data = (directory / LOG_NAME).read_bytes()
    except OSError as error:
        return VerifyResult(
            ok=False, records=0, reason=f"cannot read {directory / LOG_NAME}: {error.strerror}"
        )
    complete = data.rfind(b"\n") + 1
    count = data.count(b"\n")
    try:
        if complete < len(data) and not open_tail:
            raise _Bad(count, "last line is torn (no newline); open the log with the writer to recover it")
        campaign, hashes, checkpoints, manifests = _walk(
            directory, data[:complete], key, redecide, open_tail=open_tail
        )
        if anchor is not None:
            _check_anchor(read_anchor(anchor), hashes, campaign, key)
        if expect_seq is not None and len(hashes) - 1 < expect_seq:
            raise _Bad(
                len(hashes), f"log ends at seq {len(hashes) - 1}, expected at least {expect_seq}: truncated"
            )
        # the log first: a changed manifest is reported as its changed record
        evidence_files, problems = _check_evidence(directory, manifests)
        if problems:
            raise _Bad(problems[0][0], problems[0][1], evidence=tuple(text for _, text in problems))
    except _Bad as bad:
        return VerifyResult(ok=False, records=count, bad_seq=bad.seq, reason=bad.reason, key_source=source,
                            evidence_problems=bad.evidence)
    except AuditKeyError as error:
        return VerifyResult(ok=False, records=count, reason=str(error), key_source=source)
    notes: tuple[str, ...] = (
        ()
        if anchor is not None or expect_seq is not None
        else ("no anchor/expect-seq given: a cut after an earlier checkpoint cannot be detected",)
    )
    if not manifests:
        notes += (NO_EVIDENCE_NOTE,)
    return VerifyResult(
        ok=True,
        records=len(hashes),
        campaign=campaign,
        checkpoints=checkpoints,
        key_source=source,
        notes=notes,
        evidence_files=evidence_files,
        evidence_records=len(manifests),
    )
