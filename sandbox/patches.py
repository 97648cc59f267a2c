"""Structural checks on a unified diff before git sees it: every old and new path stays inside the
workspace, and no hunk creates a symlink, changes a mode or carries binary content."""

from __future__ import annotations

import posixpath
import re

from sandbox.errors import PatchRejected

__all__ = ["check_patch_paths", "patch_paths"]

_HEADER = re.compile(r"^(?:diff --git a/(?P<a>\S+) b/(?P<b>\S+)|--- (?P<old>\S+)|\+\+\+ (?P<new>\S+)"
                     r"|rename (?:from|to) (?P<ren>.+)|copy (?:from|to) (?P<cpy>.+))$")
_FORBIDDEN = (
    (re.compile(r"^(?:new file mode|deleted file mode|old mode|new mode) 120000", re.M), "symlink"),
    (re.compile(r"^(?:old mode|new mode) ", re.M), "mode change"),
    (re.compile(r"^(?:GIT binary patch|Binary files .* differ)", re.M), "binary hunk"),
)


def patch_paths(diff: str) -> list[str]:
    """Every path a diff names (old and new side, renames, copies), `a/`/`b/` prefixes stripped."""
    paths: list[str] = []
    for line in diff.splitlines():
        m = _HEADER.match(line)
        if not m:
            continue
        for group in ("a", "b", "old", "new", "ren", "cpy"):
            value = m.group(group)
            if value is None or value == "/dev/null":
                continue
            if group in ("old", "new") and value[:2] in ("a/", "b/"):
                value = value[2:]
            paths.append(value.split("\t")[0])
    return paths


def _check_one(path: str) -> None:
    if not path or "\x00" in path or "\\" in path or any(ord(c) < 32 for c in path):
        raise PatchRejected(f"patch path {path!r} contains forbidden characters")
    if path.startswith("/"):
        raise PatchRejected(f"patch path {path!r} is absolute; paths must be relative to the workspace")
    norm = posixpath.normpath(path)
    if norm.startswith("../") or norm == ".." or "/../" in f"/{path}/" or norm != path.rstrip("/"):
        raise PatchRejected(f"patch path {path!r} is not normalised or leaves the workspace")
    if norm.split("/")[0] == ".git":
        raise PatchRejected(f"patch path {path!r} is inside .git")


def check_patch_paths(diff: str) -> list[str]:
    if not diff.strip():
        raise PatchRejected("empty patch")
    for pattern, what in _FORBIDDEN:
        if pattern.search(diff):
            raise PatchRejected(f"patch contains a {what}; only text edits of regular files are allowed")
    paths = patch_paths(diff)
    if not paths:
        raise PatchRejected("no file headers found; send a unified diff (--- a/path, +++ b/path)")
    for path in paths:
        _check_one(path)
    return paths
