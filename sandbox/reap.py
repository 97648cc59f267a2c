"""Killing server processes a dead evaluation left behind.

Servers run in their own sessions (so a Ctrl-C in the terminal does not tear them down half-way),
which also means a crashed or killed parent leaves them running. Every server's working directory
is its evaluation's run folder, so "every process whose cwd lies under that folder" finds them all,
children included, without trusting any pid file the server could have written.
"""

from __future__ import annotations

from pathlib import Path

import psutil

__all__ = ["reap_under"]


def reap_under(root: Path) -> list[int]:
    """SIGKILL every process on this host whose working directory is `root` or below; return their pids."""
    root = root.resolve()
    killed = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if Path(proc.cwd()).resolve().is_relative_to(root):
                proc.kill()
                killed.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return killed
