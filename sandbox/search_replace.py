"""SEARCH/REPLACE edit blocks (aider's format) turned into a unified diff for `Workspace.apply_patch`.

    vllm/model_executor/models/gemma4.py
    <<<<<<< SEARCH
    old lines
    =======
    new lines
    >>>>>>> REPLACE

The file name is the last non-blank line before `<<<<<<< SEARCH` (``` fences around a block are
ignored). Matching: the exact text first; then line by line ignoring trailing whitespace; then ignoring
indentation, in which case the replacement is re-indented by the same amount. A SEARCH must match exactly
one place. An empty SEARCH creates the file (or appends to it). Paths pass the same checks as a diff's
before any file is read, and the diff itself goes through `check_patch_paths` again when applied.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandbox.errors import PatchRejected
from sandbox.patches import check_patch_paths

__all__ = ["EditBlock", "parse_blocks", "apply_blocks", "blocks_to_diff"]

_SEARCH = re.compile(r"^<{5,9} SEARCH\s*$")
_DIVIDER = re.compile(r"^={5,9}\s*$")
_REPLACE = re.compile(r"^>{5,9} REPLACE\s*$")
_FENCE = re.compile(r"^```")


@dataclass(frozen=True)
class EditBlock:
    path: str
    search: str
    replace: str


def parse_blocks(text: str) -> list[EditBlock]:
    lines = text.splitlines(keepends=True)
    blocks: list[EditBlock] = []
    i = 0
    while i < len(lines):
        if not _SEARCH.match(lines[i].rstrip("\n")):
            i += 1
            continue
        path = _path_before(lines, i)
        j = i + 1
        while j < len(lines) and not _DIVIDER.match(lines[j].rstrip("\n")):
            j += 1
        k = j + 1
        while k < len(lines) and not _REPLACE.match(lines[k].rstrip("\n")):
            k += 1
        if k >= len(lines):
            raise PatchRejected(
                f"edit block for {path} at line {i + 1} is not closed "
                f"(expected '=======' then '>>>>>>> REPLACE')"
            )
        blocks.append(
            EditBlock(path=path, search="".join(lines[i + 1 : j]), replace="".join(lines[j + 1 : k]))
        )
        i = k + 1
    if not blocks:
        raise PatchRejected(
            "no SEARCH/REPLACE blocks found; expect 'path', '<<<<<<< SEARCH', '=======', '>>>>>>> REPLACE'"
        )
    return blocks


def _path_before(lines: list[str], i: int) -> str:
    for line in reversed(lines[:i]):
        stripped = line.strip()
        if not stripped or _FENCE.match(stripped):
            continue
        path = stripped.strip("`*:").strip()
        check_patch_paths(f"diff --git a/{path} b/{path}\n")
        return path
    raise PatchRejected(f"edit block at line {i + 1} names no file; put the path on the line before it")


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _find_lines(content: list[str], search: list[str], key: Callable[[str], str]) -> list[int]:
    want = [key(s) for s in search]
    have = [key(c) for c in content]
    n = len(want)
    return [i for i in range(len(have) - n + 1) if have[i : i + n] == want]


def _replace_one(content: str, block: EditBlock) -> str:
    if not block.search.strip():
        return content + ("" if not content or content.endswith("\n") else "\n") + block.replace
    count = content.count(block.search)
    if count == 1:
        return content.replace(block.search, block.replace, 1)
    if count > 1:
        raise PatchRejected(
            f"SEARCH text matches {count} places in {block.path}; add surrounding lines "
            f"so that it matches one"
        )
    have = content.splitlines(keepends=True)
    search = block.search.splitlines(keepends=True)
    replace = block.replace.splitlines(keepends=True)
    for key in (lambda s: s.rstrip(), lambda s: s.strip()):
        hits = _find_lines(have, search, key)
        if len(hits) > 1:
            raise PatchRejected(
                f"SEARCH text matches {len(hits)} places in {block.path} (ignoring whitespace); "
                f"add surrounding lines"
            )
        if hits:
            start = hits[0]
            replace = _reindent(have[start : start + len(search)], search, replace)
            tail = have[start + len(search) :]
            if replace and not replace[-1].endswith("\n") and tail:
                replace[-1] += "\n"
            return "".join(have[:start] + replace + tail)
    raise PatchRejected(
        f"SEARCH text not found in {block.path} (not even ignoring whitespace); copy the "
        f"lines exactly from the current file"
    )


def _reindent(matched: list[str], search: list[str], replace: list[str]) -> list[str]:
    """Shift the replacement by the indentation difference between the file and the SEARCH text."""
    for have, want in zip(matched, search, strict=True):
        if have.strip():
            file_ind, search_ind = _indent(have), _indent(want)
            break
    else:
        return replace
    if file_ind == search_ind:
        return replace
    if file_ind.startswith(search_ind):
        extra = file_ind[len(search_ind) :]
        return [extra + r if r.strip() else r for r in replace]
    if search_ind.startswith(file_ind):
        cut = len(search_ind) - len(file_ind)
        return [r[cut:] if r[:cut].isspace() else r.lstrip() if r.strip() else r for r in replace]
    return replace


def _read(root: Path, rel: str) -> str | None:
    path = root / rel
    for parent in [path, *path.parents]:
        if parent == root:
            break
        if parent.is_symlink():
            raise PatchRejected(
                f"{rel} goes through a symlink ({parent.relative_to(root)}); edit the real file"
            )
    if not path.resolve().is_relative_to(root.resolve()):
        raise PatchRejected(f"{rel} resolves outside the workspace")
    if not path.exists():
        return None
    if not path.is_file():
        raise PatchRejected(f"{rel} is not a regular file")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchRejected(f"{rel} is not UTF-8 text; binary files cannot be edited") from exc


def apply_blocks(root: Path, text: str) -> dict[str, tuple[str | None, str]]:
    """{path: (old content or None for a new file, new content)} after applying every block in order."""
    files: dict[str, tuple[str | None, str]] = {}
    for block in parse_blocks(text):
        if block.path not in files:
            old = _read(root, block.path)
            if old is None and block.search.strip():
                raise PatchRejected(f"{block.path} does not exist; to create it, leave SEARCH empty")
            files[block.path] = (old, old or "")
        old, current = files[block.path]
        files[block.path] = (old, _replace_one(current, block))
    return files


def _diff_lines(old: str, new: str, path: str, is_new: bool) -> list[str]:
    a = old.splitlines(keepends=True)
    b = new.splitlines(keepends=True)
    out = []
    for line in difflib.unified_diff(a, b, "/dev/null" if is_new else f"a/{path}", f"b/{path}", n=3):
        if line.startswith(("---", "+++")):
            out.append(line.rstrip("\n") + "\n")
        elif not line.endswith("\n"):
            out.append(line + "\n\\ No newline at end of file\n")
        else:
            out.append(line)
    return out


def blocks_to_diff(root: Path, text: str) -> str:
    """The unified diff (`git apply`-able, -p1) that the blocks make against the files under `root`."""
    parts: list[str] = []
    for path, (old, new) in apply_blocks(root, text).items():
        if old == new:
            continue
        parts.extend(_diff_lines(old or "", new, path, old is None))
    if not parts:
        raise PatchRejected("the SEARCH/REPLACE blocks change nothing")
    return "".join(parts)
