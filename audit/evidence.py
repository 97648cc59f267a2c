"""Evidence manifests: the files beside a log that a verdict rests on (raw benchmark outputs, prompt files, server
logs, the parity reference), bound to the log by their sha256 and size in one `evidence` record per step.

Generic on purpose: which files are a step's evidence is the caller's choice (agent/evidence.py); this module checks
their paths, hashes them when the manifest is written, and checks them again for `verify()`. A path is relative to
the log's folder, without empty, `.` or `..` parts, and names a regular file reached through no symlink: a symlink
could point anywhere (outside the folder, at a file that changes), so one is refused when the manifest is written
and reported by verify when it appears later.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from audit.base import KIND_EVIDENCE, Appended
from audit.errors import EvidenceError
from audit.reader import payload_of, read_records
from audit.writer import AuditWriter

__all__ = ["append_evidence", "bound_paths", "evidence_problems", "file_entry", "manifest", "path_problem"]


def path_problem(rel: str) -> str | None:
    """Why `rel` is not a path an evidence manifest may hold (None when it is)."""
    if not rel or "\\" in rel or "\0" in rel:
        return "is not a plain path"
    if rel.startswith("/"):
        return "is absolute, not relative to the campaign folder"
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return "has an empty, '.' or '..' part"
    return None


def _open_regular(root: Path, rel: str) -> int:
    """A read-only descriptor of root/rel; EvidenceError when the path is unsafe, a part of it is a symlink, or it
    is not a regular file. FileNotFoundError when it is not there."""
    problem = path_problem(rel)
    if problem:
        raise EvidenceError(f"{rel!r} {problem}")
    parts = rel.split("/")
    for depth in range(1, len(parts)):
        folder = root.joinpath(*parts[:depth])
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            raise EvidenceError(f"{rel}: {'/'.join(parts[:depth])} is a symlink")
    try:   # O_NONBLOCK: a FIFO put in a file's place must not hang the check (it is refused below)
        fd = os.open(root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise EvidenceError(f"{rel} is a symlink") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise EvidenceError(f"{rel} is not a regular file")
    return fd


def file_entry(root: Path, rel: str) -> dict[str, Any]:
    """{"sha256", "size"} of one evidence file (streamed: server logs and detailed results can be large)."""
    fd = _open_regular(root, rel)
    with os.fdopen(fd, "rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
        size = os.fstat(handle.fileno()).st_size
    return {"sha256": digest, "size": size}


def manifest(root: Path, paths: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Each path (relative to `root`) with its sha256 and size, sorted. Raises EvidenceError naming the first path
    that cannot be bound: unsafe, a symlink, not a regular file, or missing."""
    out: dict[str, dict[str, Any]] = {}
    for rel in sorted(set(paths)):
        try:
            out[rel] = file_entry(root, rel)
        except FileNotFoundError:
            raise EvidenceError(f"{rel}: no such file under {root}") from None
        except OSError as error:
            raise EvidenceError(f"{rel}: cannot be read ({error.strerror})") from None
    return out


def _problem(root: Path, rel: str, want: Mapping[str, Any]) -> str | None:
    try:
        got = file_entry(root, rel)
    except FileNotFoundError:
        return f"evidence file {rel} is missing"
    except EvidenceError as error:
        return f"evidence file {rel} cannot be checked: {error}"
    except OSError as error:
        return f"evidence file {rel} cannot be read ({error.strerror})"
    if got["sha256"] != want.get("sha256") or got["size"] != want.get("size"):
        return (f"evidence file {rel} was changed (now {got['size']} bytes, sha256 {got['sha256'][:12]}…; "
                f"bound as {want.get('size')} bytes, sha256 {str(want.get('sha256'))[:12]}…)")
    return None


def evidence_problems(root: Path, files: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every file (in path order) that is no longer as the manifest bound it (missing, changed, a symlink now), in
    words; empty when all are."""
    return [problem for rel in sorted(files) if (problem := _problem(root, rel, files[rel]))]


def append_evidence(writer: AuditWriter, paths: Iterable[str], *, step: str, iteration: int | None = None,
                    **fields: Any) -> Appended | None:
    """Hash `paths` (relative to the writer's folder) and append one `evidence` record: {"step", "files", ...fields}.
    None (and nothing written) when `paths` is empty. Call it once the step's files are complete, before the record
    that uses them. EvidenceError when a path cannot be bound."""
    files = manifest(writer.directory, paths)
    if not files:
        return None
    return writer.append(KIND_EVIDENCE, iteration=iteration, payload={**fields, "step": step, "files": files})


def bound_paths(directory: Path) -> list[str]:
    """Every path the log's evidence records bind (read tolerantly, for exporting a log that verified)."""
    paths = {rel for record in read_records(directory) if record.get("kind") == KIND_EVIDENCE
             for rel in (payload_of(directory, record).get("files") or {})}
    return sorted(rel for rel in paths if isinstance(rel, str) and path_problem(rel) is None)
