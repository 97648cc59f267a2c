"""The one writer of a log: append (fsynced before returning), checkpoint (signed), close.

Events go through a structlog processor chain that ends in the file: the bound logger's processors
turn `log.msg(kind, **fields)` into a schema-checked record, link it to the previous line (seq, prev),
render RFC 8785 canonical bytes, and the wrapped "logger" appends and fsyncs them.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog
from pydantic import ValidationError
from structlog.typing import EventDict

from audit.base import BLOB_THRESHOLD, KIND_CHECKPOINT, KIND_OPEN, KIND_RECOVERY, Anchor, Appended
from audit.blobs import put_blob
from audit.canon import canonical, genesis, line_bytes, sha256_hex
from audit.errors import AuditError, AuditKeyError, AuditWriteError, LogLockedError
from audit.fsio import append_durably, fsync_dir
from audit.keys import (
    PUBKEY_NAME,
    default_anchor_dir,
    default_key_path,
    key_id,
    load_or_create_key,
    public_pem,
    sign,
    signed_message,
    write_anchor,
)
from audit.recovery import recover_head
from audit.schema import CAMPAIGN_ID, LogRecord

__all__ = ["LOG_NAME", "AuditWriter", "utc_now"]

LOG_NAME = "log.jsonl"
LOCK_NAME = "log.lock"


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _lock(directory: Path) -> int:
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LogLockedError(
            f"{directory / LOCK_NAME} is held by another writer; stop it or use another campaign id"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _install_pubkey(directory: Path, pem: bytes) -> None:
    path = directory / PUBKEY_NAME
    if path.exists():
        if path.read_bytes() != pem:
            raise AuditKeyError(f"{path} holds another public key than the signing key; use the original key")
        return
    tmp = path.with_name(f".{PUBKEY_NAME}.tmp")
    tmp.write_bytes(pem)
    os.replace(tmp, path)
    fsync_dir(directory)


class _FileSink:
    """The structlog 'logger' at the end of the chain: appends one rendered line and fsyncs."""

    def __init__(self, writer: AuditWriter) -> None:
        self._writer = writer

    def msg(self, line: bytes) -> Appended:
        return self._writer._commit(line)


class AuditWriter:
    """Use `AuditWriter.open(...)` (or as a context manager); one per log directory at a time."""

    def __init__(
        self,
        *,
        directory: Path,
        campaign: str,
        fds: tuple[int, int],
        head: tuple[int, str],
        signing: tuple[Any, Path | None],
        blob_threshold: int,
        clock: Callable[[], str],
        echo: bool,
    ) -> None:
        self.directory = directory
        self.campaign = campaign
        self._lock_fd, self._log_fd = fds
        self._next_seq, self._head = head
        self._key, self._anchor_dir = signing
        self._key_id = key_id(self._key.public_key())
        self._blob_threshold = blob_threshold
        self._clock = clock
        self._echo = structlog.get_logger("ratchet.audit") if echo else None
        self._mutex = threading.Lock()
        self._last_kind: str | None = None
        self._broken = False
        self._closed = False
        self._log = structlog.wrap_logger(
            _FileSink(self),
            processors=[self._to_record, self._link, self._render],
            wrapper_class=structlog.BoundLogger,
            cache_logger_on_first_use=False,
        )

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        campaign: str,
        key_path: Path | None = None,
        anchor_dir: Path | None = None,
        use_anchor: bool = True,
        blob_threshold: int = BLOB_THRESHOLD,
        clock: Callable[[], str] = utc_now,
        echo: bool = False,
        header: dict[str, str] | None = None,
    ) -> AuditWriter:
        """Open (create or continue) `directory`/log.jsonl for `campaign`; recover a torn tail. `header` joins
        the log.open record, the log's first line (the campaign puts its isolation level there)."""
        if not re.match(CAMPAIGN_ID, campaign):
            raise AuditError(f"campaign id {campaign!r} must match {CAMPAIGN_ID}")
        key_path = key_path or default_key_path()
        key = load_or_create_key(key_path)
        if not directory.is_dir():
            directory.mkdir(parents=True)
            fsync_dir(directory.parent)  # the new directory's entry is durable too
        lock_fd = _lock(directory)
        try:
            _install_pubkey(directory, public_pem(key.public_key()))
            log_path = directory / LOG_NAME
            created = not log_path.exists()
            next_seq, head, torn = (
                (0, genesis(campaign), None) if created else recover_head(log_path, campaign)
            )
            log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            if created:
                fsync_dir(directory)
        except BaseException:
            os.close(lock_fd)
            raise
        anchors = (anchor_dir or default_anchor_dir(key_path)) if use_anchor else None
        writer = cls(
            directory=directory,
            campaign=campaign,
            fds=(lock_fd, log_fd),
            head=(next_seq, head),
            signing=(key, anchors),
            blob_threshold=blob_threshold,
            clock=clock,
            echo=echo,
        )
        try:
            if torn is not None:
                writer.append(KIND_RECOVERY, payload=torn)
            writer.append(
                KIND_OPEN,
                payload={**(header or {}), "key_id": writer._key_id, "pid": os.getpid(), "resumed": not created},
            )
        except BaseException:
            writer.close(checkpoint=False)
            raise
        return writer

    # -- the structlog processor chain -------------------------------------------------------
    def _to_record(self, _logger: object, _method: str, event: EventDict) -> EventDict:
        record: dict[str, Any] = {
            "v": 1,
            "campaign": self.campaign,
            "kind": event.pop("event"),
            "ts": self._clock(),
            "iteration": event.pop("iteration", None),
            "action_id": event.pop("action_id", None),
        }
        payload = event.pop("payload", None) or {}
        try:
            body = canonical(payload)
        except Exception as error:  # rfc8785 raises its own errors for NaN, huge ints, bad keys
            raise AuditWriteError(f"{record['kind']}: payload is not canonical-JSON-able: {error}") from error
        if len(body) > self._blob_threshold:
            record["payload_sha256"] = put_blob(self.directory, body)
            record["payload_size"] = len(body)
        else:
            record["payload"] = dict(payload)
        for name in ("decision", "rule", "policy_sha256"):
            value = event.pop(name, None)
            if value is not None:
                record[name] = value
        if event:
            raise AuditWriteError(f"unknown record fields {sorted(event)}; put them in payload")
        return record

    def _link(self, _logger: object, _method: str, record: EventDict) -> EventDict:
        record["seq"] = self._next_seq
        record["prev"] = self._head
        return record

    def _render(self, _logger: object, _method: str, record: EventDict) -> bytes:
        try:
            LogRecord.model_validate(record)
        except ValidationError as error:
            raise AuditWriteError(f"{record.get('kind')}: record fails the log schema: {error}") from None
        return line_bytes(record)

    def _commit(self, line: bytes) -> Appended:
        try:
            append_durably(self._log_fd, line)
        except OSError as error:
            self._broken = True
            raise AuditWriteError(
                f"{self.directory / LOG_NAME}: append failed ({error}); stop the campaign"
            ) from error
        appended = Appended(seq=self._next_seq, sha256=sha256_hex(line))
        self._next_seq += 1
        self._head = appended.sha256
        return appended

    # -- public API ----------------------------------------------------------------------------
    def append(
        self,
        kind: str,
        *,
        payload: Mapping[str, Any] | None = None,
        iteration: int | None = None,
        action_id: str | None = None,
        decision: str | None = None,
        rule: str | None = None,
        policy_sha256: str | None = None,
    ) -> Appended:
        """Append one record; it is on disk (fsynced) when this returns. Any failure raises."""
        with self._mutex:
            if self._closed or self._broken:
                raise AuditWriteError(f"{self.directory}: writer is closed or broken; reopen to continue")
            appended: Appended = self._log.msg(
                kind,
                payload=payload,
                iteration=iteration,
                action_id=action_id,
                decision=decision,
                rule=rule,
                policy_sha256=policy_sha256,
            )
            self._last_kind = kind
        if self._echo is not None:
            self._echo.info(kind, seq=appended.seq, campaign=self.campaign, decision=decision, rule=rule)
        return appended

    def checkpoint(self) -> Appended:
        """Append a signed checkpoint over the current head and refresh the external anchor."""
        covers_seq, covers = self._next_seq - 1, self._head
        message = signed_message(purpose="checkpoint", campaign=self.campaign, seq=covers_seq, sha256=covers)
        payload = {
            "covers_seq": covers_seq,
            "covers_sha256": covers,
            "key_id": self._key_id,
            "signature": sign(self._key, message),
        }
        appended = self.append(KIND_CHECKPOINT, payload=payload)
        if self._anchor_dir is not None:
            anchor_message = signed_message(
                purpose="anchor", campaign=self.campaign, seq=appended.seq, sha256=appended.sha256
            )
            anchor = Anchor(
                campaign=self.campaign,
                seq=appended.seq,
                sha256=appended.sha256,
                key_id=self._key_id,
                signature=sign(self._key, anchor_message),
            )
            try:
                write_anchor(self._anchor_dir, anchor)
            except OSError as error:
                raise AuditWriteError(f"{self._anchor_dir}: cannot write the head anchor: {error}") from error
        return appended

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def close(self, *, checkpoint: bool = True) -> None:
        """Checkpoint the tail (unless already covered or broken) and release the lock."""
        if self._closed:
            return
        try:
            if checkpoint and not self._broken and self._last_kind != KIND_CHECKPOINT:
                self.checkpoint()
        finally:
            self._closed = True
            os.close(self._log_fd)
            os.close(self._lock_fd)

    def __enter__(self) -> AuditWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(checkpoint=not isinstance(exc, AuditWriteError))
