"""Records and protocols of the sandbox: how an untrusted server process is started and stopped.

A backend turns a `Launch` (argv, env, mounts, limits) into a `Running` handle. The harness owns
health checks and timing; the backend owns isolation and cleanup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

__all__ = ["Launch", "Limits", "Mount", "Running", "Backend", "copy_out", "COLLECT_LIMIT_BYTES"]

COLLECT_LIMIT_BYTES = 512 << 20   # what collect() copies out of a sandbox at most, in all


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str            # path inside the sandbox (the local backend uses `source` as is)
    read_only: bool = True


@dataclass(frozen=True)
class Limits:
    cpus: float | None = None          # CPU quota in cores
    memory_bytes: int | None = None
    pids: int | None = 4096
    gpus: int = 0                      # 0: none; -1: all; n: that many


@dataclass(frozen=True)
class Launch:
    """One untrusted server process to start.

    `argv[0]` is the interpreter; the workspace is first on PYTHONPATH so its `vllm/` shadows the
    installed package. `port` is where the server listens on the sandbox side.
    """

    name: str
    argv: tuple[str, ...]
    workspace: Path
    env: dict[str, str]
    port: int
    log_path: Path
    mounts: tuple[Mount, ...] = ()
    limits: Limits = field(default_factory=Limits)


class Running(Protocol):
    """A started server. `base_url` is reachable from the host-side benchmark client."""

    base_url: str
    isolation: str       # e.g. "docker", "local-unshare", "local (no isolation)"

    def alive(self) -> bool: ...
    def exit_code(self) -> int | None: ...
    def stop(self) -> None: ...
    def describe(self) -> dict[str, object]: ...
    # While the other build is measured, this one is frozen (SIGSTOP / cgroup freezer): an idle vLLM still
    # polls its queues, and a candidate could burn the shared cores exactly while the incumbent runs.
    def freeze(self) -> None: ...
    def thaw(self) -> None: ...
    # Files the server wrote under `inner` (a path of its own view, e.g. /tmp/...), copied to `dest`: regular
    # files only, no links, size-capped; the server never writes into the harness's folders itself.
    def collect(self, inner: str, dest: Path) -> list[Path]: ...


class Backend(Protocol):
    name: str

    def start(self, launch: Launch) -> Running: ...


def copy_out(source: Path, dest: Path, *, limit: int = COLLECT_LIMIT_BYTES) -> list[Path]:
    """Copy the regular files under `source` (a directory the server wrote) flat into `dest`. Symlinks,
    devices and anything past `limit` bytes are skipped: the server chose what is there."""
    import os
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    total = 0
    if not source.is_dir() or source.is_symlink():
        return out
    for root, dirs, files in os.walk(source, followlinks=False):
        dirs[:] = [d for d in dirs if not (Path(root) / d).is_symlink()]
        for name in sorted(files):
            path = Path(root) / name
            st = path.lstat()
            if not path.is_file() or path.is_symlink() or total + st.st_size > limit:
                continue
            total += st.st_size
            target = dest / name.replace(os.sep, "_")
            shutil.copyfile(path, target, follow_symlinks=False)
            out.append(target)
    return out
