"""Records and protocols of the sandbox: how an untrusted server process is started and stopped.

A backend turns a `Launch` (argv, env, mounts, limits) into a `Running` handle. The harness owns
health checks and timing; the backend owns isolation and cleanup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

__all__ = ["Launch", "Limits", "Mount", "Running", "Backend"]


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


class Backend(Protocol):
    name: str

    def start(self, launch: Launch) -> Running: ...
