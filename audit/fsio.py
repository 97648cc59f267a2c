"""Durable file operations: every write here is fsynced before the function returns."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["append_durably", "fsync_dir", "write_new_file"]


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_new_file(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Create `path` exclusively (FileExistsError if present), write, fsync file and directory."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path.parent)


def append_durably(fd: int, data: bytes) -> None:
    """Append to an O_APPEND descriptor and fsync it."""
    _write_all(fd, data)
    os.fsync(fd)
