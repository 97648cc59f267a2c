"""Opening an existing log: find its head, and move a crash-torn last line aside (never rewrite it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from audit.canon import genesis, parse_line, sha256_hex
from audit.errors import LogFormatError
from audit.fsio import write_new_file
from audit.schema import LogRecord

__all__ = ["recover_head"]


def _record(line: bytes) -> LogRecord | None:
    try:
        return LogRecord.model_validate(parse_line(line))
    except (ValueError, ValidationError):
        return None


def _move_aside(log_path: Path, data: bytes, offset: int) -> dict[str, Any]:
    n = 0
    while (log_path.parent / f"{log_path.name}.torn-{n}").exists():
        n += 1
    torn_path = log_path.parent / f"{log_path.name}.torn-{n}"
    torn = data[offset:]
    write_new_file(torn_path, torn, mode=0o444)
    fd = os.open(log_path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return {
        "torn_file": torn_path.name,
        "torn_offset": offset,
        "torn_size": len(torn),
        "torn_sha256": sha256_hex(torn),
    }


def recover_head(log_path: Path, campaign: str) -> tuple[int, str, dict[str, Any] | None]:
    """Return (next seq, sha256 of the last line, recovery payload or None) for an existing log."""
    data = log_path.read_bytes()
    torn: dict[str, Any] | None = None
    end = data.rfind(b"\n") + 1
    if end < len(data):  # bytes after the last newline: a torn append
        torn = _move_aside(log_path, data, end)
        data = data[:end]
    elif data:
        start = data.rfind(b"\n", 0, end - 1) + 1
        if _record(data[start : end - 1]) is None:  # a whole last line that is not a record
            torn = _move_aside(log_path, data, start)
            data = data[:start]
    if not data:
        return 0, genesis(campaign), torn
    start = data.rfind(b"\n", 0, len(data) - 1) + 1
    last = data[start:]
    record = _record(last[:-1])
    if record is None:
        raise LogFormatError(f"{log_path}: the last complete line is corrupt; run `ratchet audit verify`")
    if record.campaign != campaign:
        raise LogFormatError(f"{log_path} belongs to campaign {record.campaign!r}, not {campaign!r}")
    return record.seq + 1, sha256_hex(last), torn
