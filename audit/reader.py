"""Reading a log for humans (show, report): tolerant, never used for verification."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from audit.blobs import blob_path
from audit.writer import LOG_NAME

__all__ = ["payload_of", "read_records"]


def read_records(directory: Path) -> list[dict[str, Any]]:
    """Every line of log.jsonl that parses as a JSON object (unparsable lines are skipped)."""
    records: list[dict[str, Any]] = []
    with (directory / LOG_NAME).open("rb") as handle:
        for raw in handle:
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict):
                records.append(obj)
    return records


def payload_of(directory: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The record's payload, loaded from its blob when stored by digest ({} if unreadable)."""
    payload = record.get("payload")
    if isinstance(payload, dict):
        return payload
    digest = record.get("payload_sha256")
    if isinstance(digest, str):
        try:
            loaded = json.loads(blob_path(directory, digest).read_bytes())
        except (OSError, ValueError):
            return {}
        return loaded if isinstance(loaded, dict) else {}
    return {}
