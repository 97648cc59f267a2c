"""Local backends: the server is a subprocess in its own session.

`LocalBackend(isolation="none")` (spec `sandbox.backend: unisolated`, only by name): a clean environment
and process-group cleanup, nothing more; candidate code runs as this user. Logs and reports say so.

`LocalBackend(isolation="netns")` (spec `bwrap`; `auto` picks it where dockerd is absent; root, `ip`,
`iptables`, `bwrap` and `setpriv` needed; the first three from PATH or from the folder RATCHET_SANDBOX_TOOLS names,
sandbox/host_tools.py): the server runs in its own network namespace joined to the
host by a veth pair on a private /30 (the host reaches it at the namespace's address; a host firewall
rule admits only replies from it and nothing is forwarded), inside bubblewrap with a fresh root that
holds only what a server needs, read-only: /usr, /lib*, /bin, /sbin, /etc, /sys, the interpreter and its
venv, the workspace, the model and the mounts. HOME, /tmp, /run and /dev/shm are fresh tmpfs; the
harness, the logs, the signing key, the held prompts and other builds' trees are not there at all.
Inside, `setpriv` drops to uid/gid 10001 with no capabilities (bounding set cleared, no_new_privs) before
the server starts, so even a path that is bound is only as readable as it is to an unprivileged user.
When the spec asks for GPUs, the device nodes (/dev/nvidia*, nvidia-caps) are bound as devices and the driver's
library folders outside /usr and /lib* read-only. No memory/CPU/pids limits.

Either way the server's working directory is an empty folder outside the campaign's log folder
(`server_cwd`), so nothing it writes by a relative path lands beside the log.
"""

from __future__ import annotations

import contextlib
import functools
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

from sandbox.base import Launch, copy_out
from sandbox.errors import BackendUnavailable, LaunchFailed
from sandbox.host_tools import SYSTEM_PATHS, HostTools, gpu_device_nodes, gpu_library_dirs, host_tools

__all__ = ["LocalBackend", "LocalRunning", "server_cwd", "SERVER_CWD_ROOT"]

# Servers' working directories: one empty folder per server log, named by a hash of the log's path, plus
# a record beside it (outside the folder the server can write) of which log folder it belongs to; the reaper
# finds a dead campaign's servers by it (sandbox/reap.py).
SERVER_CWD_ROOT = Path(os.environ.get("RATCHET_SERVER_CWD", "/tmp/ratchet-servers"))


def server_cwd(log_path: Path) -> Path:
    import hashlib

    owner = log_path.resolve().parent
    key = hashlib.sha256(str(log_path.resolve()).encode()).hexdigest()[:20]
    SERVER_CWD_ROOT.mkdir(parents=True, exist_ok=True, mode=0o755)
    cwd = SERVER_CWD_ROOT / key
    if cwd.exists():
        shutil.rmtree(cwd, ignore_errors=True)   # a previous server of this log path: start empty
    cwd.mkdir(mode=0o700)
    (SERVER_CWD_ROOT / f"{key}.owner").write_text(str(owner))
    return cwd

_STOP_GRACE_S = 15.0
_GONE_S = 10.0         # after SIGKILL: how long stop() waits for the group's processes to be gone
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

    def collect(self, inner: str, dest: Path) -> list[Path]:
        """Unisolated: `inner` is a host path. bwrap: it lies in the sandbox's own root, reached through the
        innermost process's /proc/<pid>/root (the server's mount namespace)."""
        if self.netns is None:
            return copy_out(Path(inner), dest)
        members = sorted(_group_members(self.process.pid), key=lambda p: p.pid)
        for proc in reversed(members):
            root = Path(f"/proc/{proc.pid}/root")
            with contextlib.suppress(OSError):
                if os.stat(root).st_dev != os.stat("/").st_dev or os.readlink(f"/proc/{proc.pid}/ns/mnt") != \
                        os.readlink("/proc/self/ns/mnt"):
                    return copy_out(root / inner.lstrip("/"), dest)
        return []

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
        _wait_gone(leftovers, timeout=_GONE_S)
        if self._cleanup is not None:
            self._cleanup()


def _wait_gone(procs: list[psutil.Process], *, timeout: float) -> None:
    """SIGKILL is delivered at once but a process with gigabytes mapped (a vLLM worker) takes a moment to exit
    on a loaded host: stop() returns once they are gone (or zombies), so that no caller sees them running."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        if alive:
            time.sleep(0.05)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


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


def _ip(tools: HostTools, *args: str) -> None:
    proc = subprocess.run([*tools.ip, *args], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise LaunchFailed(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")


def _iptables(tools: HostTools, action: str, chain: str, *rule: str, tag: str) -> None:
    argv = [*tools.iptables, "-w", "10", action, chain, *rule, "-m", "comment", "--comment", tag, "-j", "DROP"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                          env={**os.environ, **dict(tools.iptables_env)})
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
    tools: HostTools = HostTools()

    def rules(self) -> list[tuple[str, tuple[str, ...]]]:
        return [("INPUT", ("-i", self.host_if, "-m", "conntrack", "!", "--ctstate", "ESTABLISHED,RELATED")),
                ("FORWARD", ("-i", self.host_if)), ("FORWARD", ("-o", self.host_if))]

    def up(self) -> None:
        ns_if = "rtc" + self.host_if[3:]
        ip = functools.partial(_ip, self.tools)
        ip("netns", "add", self.name)
        ip("link", "add", self.host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", self.name)
        ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        ip("link", "set", self.host_if, "up")
        ip("-n", self.name, "addr", "add", f"{self.ns_ip}/30", "dev", ns_if)
        ip("-n", self.name, "link", "set", ns_if, "up")
        ip("-n", self.name, "link", "set", "lo", "up")
        for chain, rule in self.rules():
            _iptables(self.tools, "-I", chain, *rule, tag=self.tag)

    def down(self) -> None:
        for chain, rule in self.rules():
            _iptables(self.tools, "-D", chain, *rule, tag=self.tag)
        subprocess.run([*self.tools.ip, "netns", "del", self.name], capture_output=True, timeout=30)
        subprocess.run([*self.tools.ip, "link", "del", self.host_if], capture_output=True, timeout=30)


SANDBOX_UID = 10001
SANDBOX_HOME = "/tmp/home"


def _interpreter_paths(python: str) -> list[Path]:
    """The venv the server's interpreter belongs to, and the base installation it links to."""
    exe = Path(python)
    out = [exe.parent.parent]
    real = exe.resolve()
    out.append(real.parent.parent)
    return out


def _parents(path: Path, made: set[Path]) -> list[str]:
    """bwrap creates a bind's missing parents mode 0700, which uid 10001 cannot traverse: make them 0755
    (empty directories of the sandbox's own root; the host's parents, such as /root, are not exposed)."""
    out: list[str] = []
    for parent in reversed(path.parents[:-1]):
        if parent in made or str(parent) in ("/tmp", "/run"):
            continue
        made.add(parent)
        out += ["--perms", "0755", "--dir", str(parent)]
    return out


_PATH_TOOLS = HostTools()


def _setpriv() -> str:
    """setpriv runs inside the sandbox from the host's /usr: its real path there, whatever PATH the caller has."""
    found = shutil.which("setpriv")
    return str(Path(found).resolve()) if found else "setpriv"


def _bwrap_argv(launch: Launch, *, gpus: int = 0, tools: HostTools = _PATH_TOOLS,
                gpu_nodes: list[Path] | None = None, gpu_libs: list[Path] | None = None) -> list[str]:
    """bwrap's argv for `launch`; with GPUs, `gpu_nodes` and `gpu_libs` default to this host's."""
    argv = [*tools.bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp", "--tmpfs", "/run",
            "--perms", "1777", "--tmpfs", "/dev/shm",
            "--dir", SANDBOX_HOME, "--chmod", "0777", SANDBOX_HOME]
    for system in SYSTEM_PATHS:
        if Path(system).is_symlink():        # merged /usr: /bin -> usr/bin
            argv += ["--symlink", os.readlink(system), system]
        elif Path(system).exists():
            argv += ["--ro-bind", system, system]
    # The tree, the model and mounts, the interpreter and venv, and any file the command line names: the
    # same paths inside, read-only. Nothing else of the host's filesystem exists in there.
    named = [Path(a) for a in launch.argv if a.startswith("/") and Path(a).exists()]
    libs = (gpu_library_dirs() if gpu_libs is None else gpu_libs) if gpus else []
    wanted = [launch.workspace, *(m.source for m in launch.mounts), *_interpreter_paths(launch.argv[0]), *named, *libs]
    seen: list[Path] = []
    made: set[Path] = set()
    for path in sorted({Path(p).resolve() for p in wanted}, key=lambda p: len(p.parts)):
        if any(path.is_relative_to(s) for s in seen) or any(path.is_relative_to(s) for s in SYSTEM_PATHS):
            continue
        seen.append(path)
        argv += _parents(path, made) + ["--ro-bind", str(path), str(path)]
    if gpus:
        for node in gpu_device_nodes() if gpu_nodes is None else gpu_nodes:
            argv += ["--dev-bind", str(node), str(node)]
    argv += ["--chdir", "/tmp", "--",
             # root inside only long enough to mount; the server itself runs unprivileged
             _setpriv(), f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
             "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
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
                out[key] = SANDBOX_HOME + value[len(home.rstrip("/")):]
    out["PYTHONPATH"] = str(workspace)
    out["USER"] = out["LOGNAME"] = "sandbox"    # getpass.getuser() (torch's cache paths) finds no passwd entry
    out["TMPDIR"] = "/tmp"
    return out


@functools.cache
def _probe_bwrap(tools: HostTools) -> str:
    """Start one real sandbox, once per process and tools (every server start checks): "" when it works, else why
    not."""
    probe = Launch(name="probe", argv=("/usr/bin/true",), workspace=Path("/usr"), env={}, port=0,
                   log_path=Path("/dev/null"))
    try:
        proc = subprocess.run(_bwrap_argv(probe, tools=tools), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not start a sandbox here: {exc}"
    if proc.returncode != 0:
        return (f"bwrap ({tools.describe()}) could not start a sandbox here (mount namespaces refused?): "
                f"{proc.stderr.strip()[-300:]}")
    return ""


class LocalBackend:
    name = "local"

    def __init__(self, *, isolation: Literal["none", "netns"] = "none", gpus: int = 0) -> None:
        self.isolation = isolation
        self.gpus = gpus

    @classmethod
    def from_spec(cls, config: Any) -> LocalBackend:
        return cls(isolation=getattr(config, "local_isolation", "none"), gpus=getattr(config, "gpus", 0))

    def start(self, launch: Launch) -> LocalRunning:
        if self.isolation == "netns":
            return self._start_netns(launch)
        return self._start_plain(launch)

    @staticmethod
    def check_netns(*, gpus: int = 0) -> HostTools:
        """The tools the bwrap backend runs; what this host lacks for it as BackendUnavailable (probes a real
        sandbox)."""
        if os.geteuid() != 0:
            raise BackendUnavailable("the bwrap sandbox needs root (ip netns, iptables, the uid switch); run as "
                                     "root or use the docker backend")
        tools = host_tools()
        if shutil.which("setpriv") is None:       # runs inside the sandbox, from the host's /usr
            raise BackendUnavailable("setpriv not found; apt-get install -y util-linux")
        if gpus and not gpu_device_nodes():
            raise BackendUnavailable("the spec asks for GPUs but /dev/nvidia* does not exist on this host")
        why = _probe_bwrap(tools)
        if why:
            raise BackendUnavailable(why)
        return tools

    def _start_netns(self, launch: Launch) -> LocalRunning:
        tools = self.check_netns(gpus=self.gpus)
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        cwd = server_cwd(launch.log_path)
        launch_id = secrets.token_hex(4)
        host_ip, ns_ip = _free_slash30()
        ns = _Netns(name=f"rt-{launch_id}", host_if=f"rth{launch_id}", host_ip=host_ip, ns_ip=ns_ip,
                    tag=f"ratchet:rt-{launch_id}", tools=tools)
        argv = [*tools.ip, "netns", "exec", ns.name, *_bwrap_argv(launch, gpus=self.gpus, tools=tools)]
        try:
            ns.up()
            with open(launch.log_path, "ab") as log:
                process = subprocess.Popen(argv, env=_netns_env(launch.env, launch.workspace), cwd=cwd,
                                           stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        except BaseException as exc:
            ns.down()
            if isinstance(exc, OSError):
                raise LaunchFailed(f"could not start {argv[0]}: {exc}") from exc
            raise
        time.sleep(0.05)
        return LocalRunning(launch=launch, process=process, base_url=f"http://{ns_ip}:{launch.port}",
                            isolation="bwrap (netns, uid 10001)", _cleanup=ns.down,
                            netns={"name": ns.name, "host_if": ns.host_if, "host_ip": host_ip,
                                   "ns_ip": ns_ip})

    def _start_plain(self, launch: Launch) -> LocalRunning:
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(launch.env)
        env["PYTHONPATH"] = str(launch.workspace)
        # A fresh, empty working directory outside the log folder: nothing but the workspace can be
        # imported implicitly, and nothing written by a relative path lands beside the audit log.
        cwd = server_cwd(launch.log_path)
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
