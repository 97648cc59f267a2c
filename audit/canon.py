"""Canonical bytes (RFC 8785), hashes, the genesis value and strict line parsing."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import rfc8785

__all__ = ["canonical", "genesis", "line_bytes", "parse_line", "sha256_hex"]

_GENESIS_DOMAIN = b"ratchet.audit.v1\x00genesis\x00"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def genesis(campaign: str) -> str:
    """`prev` of seq 0: bound to the campaign so a log cannot be spliced onto another's start."""
    return sha256_hex(_GENESIS_DOMAIN + campaign.encode("utf-8"))


def canonical(obj: Mapping[str, Any]) -> bytes:
    return rfc8785.dumps(dict(obj))


def line_bytes(obj: Mapping[str, Any]) -> bytes:
    return canonical(obj) + b"\n"


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def parse_line(raw: bytes) -> dict[str, Any]:
    """Parse one line (without its newline); raise ValueError unless it is canonical JSON of an object."""
    obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    if not isinstance(obj, dict):
        raise ValueError("line is not a JSON object")
    if canonical(obj) != raw:
        raise ValueError("line is not in RFC 8785 canonical form")
    return obj
