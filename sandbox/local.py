"""Local backend: the server is a plain subprocess in its own session. No isolation beyond a clean
environment and process-group cleanup; logs and reports mark it as weaker than Docker."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

import psutil

from sandbox.base import Launch
from sandbox.errors import LaunchFailed

__all__ = ["LocalBackend", "LocalRunning"]

_STOP_GRACE_S = 15.0


@dataclass
class LocalRunning:
    launch: Launch
    process: subprocess.Popen[bytes]
    base_url: str
    isolation: str = "local (no isolation)"
    _stopped: bool = field(default=False, repr=False)

    def alive(self) -> bool:
        return self.process.poll() is None

    def exit_code(self) -> int | None:
        return self.process.poll()

    def describe(self) -> dict[str, object]:
        return {"backend": "local", "isolation": self.isolation, "pid": self.process.pid}

    def stop(self) -> None:
        """Terminate the whole process group, then kill anything left (vLLM spawns engine cores)."""
        if self._stopped:
            return
        self._stopped = True
        pgid = self.process.pid
        leftovers = _group_members(pgid)
        _signal_group(pgid, signal.SIGTERM)
        try:
            self.process.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(pgid, signal.SIGKILL)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - only a kernel-stuck process
            pass
        # Children that left the group (setsid) are still tracked by pid.
        for proc in leftovers:
            try:
                proc.kill()
            except psutil.Error:
                pass


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    try:
        members.extend(psutil.Process(pgid).children(recursive=True))
    except psutil.Error:
        pass
    return members


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class LocalBackend:
    name = "local"

    def start(self, launch: Launch) -> LocalRunning:
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(launch.env)
        env["PYTHONPATH"] = str(launch.workspace)
        # A fresh, empty working directory: nothing but the workspace can be imported implicitly.
        cwd = launch.log_path.parent
        log = open(launch.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            process = subprocess.Popen(
                list(launch.argv),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise LaunchFailed(f"could not start {launch.argv[0]}: {exc}; check the interpreter path") from exc
        finally:
            log.close()
        time.sleep(0.05)
        return LocalRunning(launch=launch, process=process, base_url=f"http://127.0.0.1:{launch.port}")
