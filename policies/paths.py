"""Path normalisation: the only spelling of a path the gate ever matches.

Rules (each failure raises PathRejected with the reason):
- a non-empty str of at most 4096 characters, relative to the workspace root (no leading '/');
- no NUL, no backslash, no control or format characters (Unicode categories Cc and Cf: this
  catches bidi overrides and zero-width characters that make two paths look the same);
- already in Unicode NFC form: a path whose NFC form differs is *rejected*, not silently
  normalised, so the name that is checked is byte-for-byte the name that will be written;
- no empty components ('a//b', trailing '/'); '.' components are dropped;
- '..' is resolved lexically ('a/../b' -> 'b'); a path that climbs above the root is rejected.
"""

from __future__ import annotations

import unicodedata

from policies.errors import PathRejected

__all__ = ["MAX_PATH", "join", "normalize_path"]

MAX_PATH = 4096


def normalize_path(raw: object) -> tuple[str, ...]:
    """Return the normalised components of a workspace-relative path, or raise PathRejected."""
    if not isinstance(raw, str) or not raw:
        raise PathRejected(f"path {raw!r} is not a non-empty string")
    if len(raw) > MAX_PATH:
        raise PathRejected(f"path is longer than {MAX_PATH} characters")
    if "\x00" in raw:
        raise PathRejected(f"path {raw!r} contains NUL")
    if "\\" in raw:
        raise PathRejected(f"path {raw!r} contains a backslash; use '/' separators")
    for char in raw:
        if unicodedata.category(char) in ("Cc", "Cf"):
            raise PathRejected(f"path {raw!r} contains control/format character U+{ord(char):04X}")
    if unicodedata.normalize("NFC", raw) != raw:
        raise PathRejected(f"path {raw!r} is not in Unicode NFC form")
    if raw.startswith("/"):
        raise PathRejected(f"path {raw!r} is absolute; paths are relative to the workspace root")
    parts: list[str] = []
    for component in raw.split("/"):
        if component == "":
            raise PathRejected(f"path {raw!r} has an empty component")
        if component == ".":
            continue
        if component == "..":
            if not parts:
                raise PathRejected(f"path {raw!r} escapes the workspace root")
            parts.pop()
            continue
        parts.append(component)
    if not parts:
        raise PathRejected(f"path {raw!r} names the workspace root itself")
    return tuple(parts)


def join(parts: tuple[str, ...]) -> str:
    return "/".join(parts)
