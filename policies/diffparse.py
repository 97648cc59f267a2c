"""Unified-diff parsing for the gate: every path a patch names, every line it adds.

Hunks are parsed by `unidiff`; every line outside a hunk is then checked here against a strict
grammar of git headers, so a path cannot hide in a header `unidiff` does not model (`rename from`,
`copy to`, a `---` line that disagrees with `diff --git`). Anything unknown is rejected.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

from policies.errors import PatchRejected

__all__ = ["ParsedPatch", "parse_patch"]

_REGULAR_MODES = frozenset({"100644", "100755"})
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")
_INDEX = re.compile(r"^index [0-9a-f]+\.\.[0-9a-f]+(?: (?P<mode>\d+))?$")
_SIMILARITY = re.compile(r"^(?:dis)?similarity index \d{1,3}%$")
_PATH_HEADERS = ("rename from ", "rename to ", "copy from ", "copy to ")


@dataclass(frozen=True)
class ParsedPatch:
    paths: tuple[str, ...]  # every old and new path named by any header, a/ b/ stripped, in order
    added_lines: tuple[str, ...]  # every '+' line of every hunk, without the '+'
    files: int  # number of file sections


def _strip_prefix(name: str, prefix: str, line_no: int) -> str | None:
    if name == "/dev/null":
        return None
    if name.startswith('"'):
        raise PatchRejected(f"line {line_no}: quoted path {name} (special characters) is not allowed")
    if not name.startswith(prefix):
        raise PatchRejected(f"line {line_no}: path {name!r} lacks the git prefix {prefix!r}")
    return name[len(prefix) :]


def _header_paths(line: str, line_no: int) -> list[str]:
    """Check one line outside any hunk; return the paths it names."""
    body = line.rstrip("\n")
    if body == "" or body.startswith("\\ No newline at end of file") or _HUNK.match(body):
        return []
    if body.startswith("diff --git "):
        tokens = body.split(" ")
        if len(tokens) != 4:
            raise PatchRejected(f"line {line_no}: cannot split {body!r} (paths with spaces are not allowed)")
        names = [_strip_prefix(tokens[2], "a/", line_no), _strip_prefix(tokens[3], "b/", line_no)]
        return [name for name in names if name is not None]
    for marker, prefix in (("--- ", "a/"), ("+++ ", "b/")):
        if body.startswith(marker):
            name = _strip_prefix(body[len(marker) :].split("\t", 1)[0], prefix, line_no)
            return [] if name is None else [name]
    for marker in _PATH_HEADERS:
        if body.startswith(marker):
            return [body[len(marker) :]]
    for marker, allowed in (("new file mode ", {"100644"}), ("deleted file mode ", _REGULAR_MODES)):
        if body.startswith(marker):
            mode = body[len(marker) :]
            if mode not in allowed:
                raise PatchRejected(f"line {line_no}: {marker}{mode} is not allowed (only regular files)")
            return []
    if body.startswith(("old mode ", "new mode ")):
        raise PatchRejected(f"line {line_no}: mode changes are not allowed ({body!r})")
    index = _INDEX.match(body)
    if index:
        mode = index.group("mode")
        if mode is not None and mode not in _REGULAR_MODES:
            raise PatchRejected(f"line {line_no}: file mode {mode} (symlink/submodule) is not allowed")
        return []
    if _SIMILARITY.match(body):
        return []
    if body.startswith(("GIT binary patch", "Binary files ", "literal ", "delta ")):
        raise PatchRejected(f"line {line_no}: binary patches are not allowed")
    raise PatchRejected(f"line {line_no}: unexpected line outside a hunk: {body[:80]!r}")


def parse_patch(text: str) -> ParsedPatch:
    """Parse a git-style unified diff; raise PatchRejected on anything the gate does not allow."""
    if "\x00" in text:
        raise PatchRejected("patch contains NUL")
    try:
        patch = PatchSet(io.StringIO(text))
    except UnidiffParseError as error:
        raise PatchRejected(f"not a valid unified diff: {error}") from None
    if len(patch) == 0:
        raise PatchRejected("patch names no file")
    in_hunk: set[int] = set()
    added: list[str] = []
    for patched in patch:
        if patched.is_binary_file or patched.is_symlink or patched.is_submodule:
            raise PatchRejected(f"{patched.path}: binary, symlink or submodule changes are not allowed")
        for hunk in patched:
            for body in hunk:
                if body.diff_line_no is not None:
                    in_hunk.add(body.diff_line_no)
                if body.is_added:
                    added.append(body.value.rstrip("\n"))
    paths: list[str] = []
    for line_no, line in enumerate(io.StringIO(text), 1):
        if line_no not in in_hunk:
            paths.extend(_header_paths(line, line_no))
    if not paths:
        raise PatchRejected("patch names no path")
    return ParsedPatch(paths=tuple(dict.fromkeys(paths)), added_lines=tuple(added), files=len(patch))
