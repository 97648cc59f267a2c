"""Killing server processes a dead evaluation left behind.

Servers run in their own sessions (so a Ctrl-C in the terminal does not tear them down half-way),
which also means a crashed or killed parent leaves them running. Every local server's working directory
is an empty folder under `SERVER_CWD_ROOT` whose owner record (written by the harness beside it, not in
it) names the evaluation's run folder that holds its log; "every process whose cwd is such a folder of a
run folder under `root`" finds them all, children included, without trusting any pid file the server
could have written. (Docker servers are containers labelled by the backend: `ratchet sandbox prune`.)
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil

from sandbox.local import SERVER_CWD_ROOT

__all__ = ["reap_under", "owned_server_cwds"]


def owned_server_cwds(root: Path) -> list[Path]:
    """The working directories of servers whose log lies under `root`."""
    out = []
    for record in SERVER_CWD_ROOT.glob("*.owner"):
        with contextlib.suppress(OSError):
            if Path(record.read_text().strip()).resolve().is_relative_to(root):
                out.append(record.with_suffix(""))
    return out


def reap_under(root: Path) -> list[int]:
    """SIGKILL every process on this host whose working directory is a server folder of a log under
    `root` (or lies under `root` itself); return their pids."""
    root = root.resolve()
    cwds = owned_server_cwds(root)
    killed = []
    for proc in psutil.process_iter(["pid"]):
        try:
            cwd = Path(proc.cwd()).resolve()
            if cwd.is_relative_to(root) or any(cwd.is_relative_to(c) for c in cwds):
                proc.kill()
                killed.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return killed
