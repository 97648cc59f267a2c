"""Content-addressed payload blobs: <dir>/blobs/sha256/<hex>, written and fsynced before the record."""

from __future__ import annotations

from pathlib import Path

from audit.canon import sha256_hex
from audit.errors import AuditWriteError
from audit.fsio import fsync_dir, write_new_file

__all__ = ["blob_path", "check_blob", "put_blob"]


def blob_path(directory: Path, digest: str) -> Path:
    return directory / "blobs" / "sha256" / digest


def put_blob(directory: Path, data: bytes) -> str:
    """Store `data` under its sha256; an existing blob must hold the same bytes."""
    digest = sha256_hex(data)
    path = blob_path(directory, digest)
    if path.exists():
        if sha256_hex(path.read_bytes()) != digest:
            raise AuditWriteError(f"{path}: existing blob does not match its name; move it aside and retry")
        return digest
    try:
        if not path.parent.exists():
            path.parent.mkdir(parents=True)
            fsync_dir(path.parent.parent)
            fsync_dir(directory)
        write_new_file(path, data, mode=0o444)
    except OSError as error:
        raise AuditWriteError(f"{path}: cannot write blob: {error}") from error
    return digest


def check_blob(directory: Path, digest: str, size: int | None) -> str | None:
    """None when the blob exists and matches its digest (and size), else the problem."""
    path = blob_path(directory, digest)
    try:
        data = path.read_bytes()
    except OSError:
        return f"blob {digest} is missing from {path.parent}"
    if sha256_hex(data) != digest:
        return f"blob {digest} does not match its digest (changed after writing)"
    if size is not None and len(data) != size:
        return f"blob {digest} has {len(data)} bytes, record says {size}"
    return None
