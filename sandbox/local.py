"""Local backend: the server is a plain subprocess in its own session.

`LocalBackend()` (isolation "none"): no isolation beyond a clean environment and process-group cleanup;
logs and reports mark it as weaker than Docker.

`LocalBackend(isolation="netns")` (root, `ip` and `bwrap` needed): the server runs in its own network
namespace joined to the host by a veth pair on a private /30 (the host reaches it at the namespace's
address; a host firewall rule admits only replies from it and nothing is forwarded), inside bubblewrap:
the whole host filesystem read-only, fresh /tmp, /run and /dev/shm (so host sockets such as
docker.sock are hidden), its own PID/IPC namespaces, all capabilities dropped. Weaker than Docker: it
runs as uid 0 (without capabilities) and can read what root can read; no memory/CPU/pids limits.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil

from sandbox.base import Launch
from sandbox.errors import BackendUnavailable, LaunchFailed

__all__ = ["LocalBackend", "LocalRunning"]

_STOP_GRACE_S = 15.0
_HALTED = (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE)


@dataclass
class LocalRunning:
    launch: Launch
    process: subprocess.Popen[bytes]
    base_url: str
    isolation: str = "local (no isolation)"
    netns: dict[str, str] | None = None
    _cleanup: Callable[[], None] | None = field(default=None, repr=False)
    _stopped: bool = field(default=False, repr=False)
    # stop() may be called from a watchdog thread and from the harness's cleanup at once: the second
    # caller must wait until the processes are really gone, not return while the first is still waiting.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _frozen: list[psutil.Process] = field(default_factory=list, repr=False)

    def alive(self) -> bool:
        return self.process.poll() is None

    def exit_code(self) -> int | None:
        return self.process.poll()

    def describe(self) -> dict[str, object]:
        info: dict[str, object] = {"backend": "local", "isolation": self.isolation, "pid": self.process.pid}
        if self.netns is not None:
            info["netns"] = dict(self.netns)
        return info

    def freeze(self) -> None:
        """SIGSTOP every process of the server: its group and descendants that left it (setsid)."""
        self._frozen = _group_members(self.process.pid)
        for proc in self._frozen:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGSTOP)
        # Signals are delivered asynchronously: return only once every process is stopped (or gone).
        deadline = time.monotonic() + 2.0
        for proc in self._frozen:
            with contextlib.suppress(psutil.Error):
                while proc.status() not in _HALTED and time.monotonic() < deadline:
                    time.sleep(0.005)

    def thaw(self) -> None:
        # The processes frozen, and whatever is in the group now: nothing stays stopped by accident.
        for proc in [*self._frozen, *_group_members(self.process.pid)]:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGCONT)
        self._frozen = []

    def stop(self) -> None:
        """Terminate the whole process group, then kill anything left (vLLM spawns engine cores)."""
        with self._lock:
            if not self._stopped:
                self._stop()
                self._stopped = True

    def _stop(self) -> None:
        pgid = self.process.pid
        self.thaw()   # a stopped process would hold SIGTERM until the grace period ends
        leftovers = _group_members(pgid)
        _signal_group(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=_STOP_GRACE_S)
        _signal_group(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):  # only a kernel-stuck process outlives SIGKILL
            self.process.wait(timeout=5)
        # Children that left the group (setsid) are still tracked by pid.
        for proc in leftovers:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if self._cleanup is not None:
            self._cleanup()


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    with contextlib.suppress(psutil.Error):
        members.extend(psutil.Process(pgid).children(recursive=True))
    return members


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise LaunchFailed(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")


def _iptables(action: str, chain: str, *rule: str, tag: str) -> None:
    argv = ["iptables", "-w", "10", action, chain, *rule, "-m", "comment", "--comment", tag, "-j", "DROP"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0 and action == "-I":
        raise LaunchFailed(f"{' '.join(argv)} failed: {proc.stderr.strip()}")


def _free_slash30() -> tuple[str, str]:
    """(host address, namespace address) of an unused /30 in 10.213.0.0/16."""
    used = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET}
    rng = random.SystemRandom()
    for _ in range(100):
        base = f"10.213.{rng.randrange(256)}."
        last = rng.randrange(0, 256, 4)
        quad = {f"{base}{last + k}" for k in range(4)}
        if not quad & used:
            return f"{base}{last + 1}", f"{base}{last + 2}"
    raise LaunchFailed("no free /30 in 10.213.0.0/16 for a server namespace; remove stale rth* interfaces")


@dataclass(frozen=True)
class _Netns:
    name: str
    host_if: str
    host_ip: str
    ns_ip: str
    tag: str

    def rules(self) -> list[tuple[str, tuple[str, ...]]]:
        return [("INPUT", ("-i", self.host_if, "-m", "conntrack", "!", "--ctstate", "ESTABLISHED,RELATED")),
                ("FORWARD", ("-i", self.host_if)), ("FORWARD", ("-o", self.host_if))]

    def up(self) -> None:
        ns_if = "rtc" + self.host_if[3:]
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", self.name)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("-n", self.name, "addr", "add", f"{self.ns_ip}/30", "dev", ns_if)
        _ip("-n", self.name, "link", "set", ns_if, "up")
        _ip("-n", self.name, "link", "set", "lo", "up")
        for chain, rule in self.rules():
            _iptables("-I", chain, *rule, tag=self.tag)

    def down(self) -> None:
        for chain, rule in self.rules():
            _iptables("-D", chain, *rule, tag=self.tag)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=30)


def _bwrap_argv(launch: Launch) -> list[str]:
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--tmpfs", "/run", "--tmpfs", "/dev/shm", "--dir", "/tmp/home"]
    # Paths that /tmp or /run now hide come back read-only: the tree, the mounts, the interpreter's
    # environment (a venv under /tmp, as in a CI clone there) and any file the command line names.
    named = [Path(a) for a in launch.argv if a.startswith("/") and Path(a).exists()]
    venv = Path(launch.argv[0]).parent.parent
    seen: set[Path] = set()
    for path in (launch.workspace, *(m.source for m in launch.mounts), venv, *named):
        resolved = Path(path).resolve()
        if (resolved.is_relative_to("/tmp") or resolved.is_relative_to("/run")) and resolved not in seen \
                and not any(resolved.is_relative_to(s) for s in seen):
            seen.add(resolved)
            argv += ["--ro-bind", str(resolved), str(resolved)]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--cap-drop", "ALL",
             "--chdir", "/tmp", "--"]
    args = list(launch.argv)
    for i, arg in enumerate(args[:-1]):
        if arg == "--host" and args[i + 1] in ("127.0.0.1", "localhost"):
            args[i + 1] = "0.0.0.0"          # only the namespace's veth and lo exist in there
    return argv + args


def _netns_env(env: dict[str, str], workspace: Path) -> dict[str, str]:
    out = dict(env)
    home = env.get("HOME")
    if home:
        for key, value in env.items():
            if value == home or value.startswith(home.rstrip("/") + "/"):
                out[key] = "/tmp/home" + value[len(home.rstrip("/")):]
    out["PYTHONPATH"] = str(workspace)
    return out


class LocalBackend:
    name = "local"

    def __init__(self, *, isolation: Literal["none", "netns"] = "none") -> None:
        self.isolation = isolation

    @classmethod
    def from_spec(cls, config: Any) -> LocalBackend:
        return cls(isolation=getattr(config, "local_isolation", "none"))

    def start(self, launch: Launch) -> LocalRunning:
        if self.isolation == "netns":
            return self._start_netns(launch)
        return self._start_plain(launch)

    @staticmethod
    def check_netns() -> None:
        if os.geteuid() != 0:
            raise BackendUnavailable("local netns isolation needs root (ip netns, iptables); run as root or "
                                     "use sandbox.local_isolation: none")
        for tool, package in (("ip", "iproute2"), ("bwrap", "bubblewrap"), ("iptables", "iptables")):
            if shutil.which(tool) is None:
                raise BackendUnavailable(f"{tool} not found; apt-get install -y {package}")

    def _start_netns(self, launch: Launch) -> LocalRunning:
        self.check_netns()
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        launch_id = secrets.token_hex(4)
        host_ip, ns_ip = _free_slash30()
        ns = _Netns(name=f"rt-{launch_id}", host_if=f"rth{launch_id}", host_ip=host_ip, ns_ip=ns_ip,
                    tag=f"ratchet:rt-{launch_id}")
        argv = ["ip", "netns", "exec", ns.name, *_bwrap_argv(launch)]
        try:
            ns.up()
            with open(launch.log_path, "ab") as log:
                process = subprocess.Popen(argv, env=_netns_env(launch.env, launch.workspace),
                                           stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        except BaseException as exc:
            ns.down()
            if isinstance(exc, OSError):
                raise LaunchFailed(f"could not start {argv[0]}: {exc}") from exc
            raise
        time.sleep(0.05)
        return LocalRunning(launch=launch, process=process, base_url=f"http://{ns_ip}:{launch.port}",
                            isolation="local-netns+bwrap", _cleanup=ns.down,
                            netns={"name": ns.name, "host_if": ns.host_if, "host_ip": host_ip,
                                   "ns_ip": ns_ip})

    def _start_plain(self, launch: Launch) -> LocalRunning:
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
