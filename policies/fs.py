"""The gate's one piece of filesystem I/O: symlink checks under a workspace root."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FsWorkspace"]


@dataclass(frozen=True)
class FsWorkspace:
    """A real workspace root. `symlink_in` lstat()s every existing component of a path."""

    root: Path

    def symlink_in(self, parts: tuple[str, ...]) -> str | None:
        current = self.root
        for i, part in enumerate(parts):
            current = current / part
            try:
                mode = os.lstat(current).st_mode
            except FileNotFoundError:
                return None  # the rest does not exist yet: nothing below can be a link
            if stat.S_ISLNK(mode):
                return "/".join(parts[: i + 1])
            if i < len(parts) - 1 and not stat.S_ISDIR(mode):
                return None  # a file in the middle: the write will fail on its own
        return None
