"""Docker backend: each untrusted server runs in its own container on its own internal network.

Isolation, per launch:
- network: a fresh `internal=True` bridge network (no default route, so nothing outside and no other
  candidate's network is routable); the host reaches the server at the container's IP on that bridge.
  The bridge's own host address would still accept new connections from the container, so a host
  firewall rule (`iptables INPUT -i <bridge>`, only replies allowed) closes it; IPv6 is off inside.
- filesystem: read-only root, the workspace read-only at `WORKSPACE_TARGET`, the model and every
  Launch mount read-only, tmpfs for /tmp and the server's HOME (vLLM's cache dir is mapped there).
- privileges: user 10001, `cap_drop=ALL`, `no-new-privileges`, pids/memory/CPU limits, GPUs only
  when asked (`device_requests`).
- env: an allowlist; loader and interpreter hooks (LD_*, PYTHONSTARTUP, PYTHONHOME, BASH_ENV, ...) are
  refused; PYTHONPATH is set here to the workspace mount.

The harness passes `--host 127.0.0.1` for the local backend; inside a container that address is
unreachable from the host, so it is rewritten to 0.0.0.0 (only the launch's own bridge reaches it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from sandbox.base import Launch, Limits, copy_out
from sandbox.errors import BackendUnavailable, LaunchFailed

__all__ = [
    "DockerBackend",
    "DockerRunning",
    "container_args",
    "check_env",
    "LABEL",
    "WORKSPACE_TARGET",
    "SANDBOX_HOME",
    "DEFAULT_IMAGE_PYTHON",
    "connect",
    "leftover_containers",
    "check_readable",
    "reap_containers_under",
    "resolve_image",
]

LABEL = "ratchet.sandbox"  # every container and network we create carries it
WORKSPACE_TARGET = "/workspace"
SANDBOX_HOME = "/home/sandbox"
SANDBOX_USER = "10001:10001"
DEFAULT_IMAGE_PYTHON = "python3"  # images without a ratchet.python label (e.g. plain vllm/vllm-openai)
_IMAGE_PYTHON_LABEL = "ratchet.python"
_STOP_GRACE_S = 10
_RESERVED_TARGETS = (WORKSPACE_TARGET, "/proc", "/sys", "/dev", "/etc", "/opt/ratchet")

_ENV_EXACT = frozenset(
    {
        "HOME",
        "PATH",
        "LANG",
        "LC_ALL",
        "TZ",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONUNBUFFERED",
        "PYTHONHASHSEED",
        "DO_NOT_TRACK",
        "TMPDIR",
    }
)
_ENV_PREFIXES = (
    "VLLM_",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "OMP_",
    "MKL_",
    "KMP_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "CUDA_",
    "NCCL_",
    "NVIDIA_",
    "TRITON_",
)
# Named so that the error can say why; anything else outside the allowlist is refused too.
_ENV_DENIED = frozenset(
    {
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PYTHONINSPECT",
        "PYTHONPATH",
        "PYTHONUSERBASE",
        "PYTHONEXECUTABLE",
        "BASH_ENV",
        "ENV",
        "PYTHONBREAKPOINT",
        "PYTHONSAFEPATH",
        "PYTHONNOUSERSITE",
    }
)


def check_env(env: dict[str, str]) -> None:
    """Refuse keys that change what the interpreter or loader runs, and anything not allowlisted."""
    for key in env:
        if key in _ENV_DENIED or key.startswith("LD_"):
            raise LaunchFailed(
                f"env {key} is not allowed in the docker sandbox (it changes what code runs); remove it from server.env"
            )
        if key not in _ENV_EXACT and not key.startswith(_ENV_PREFIXES):
            raise LaunchFailed(
                f"env {key} is not on the docker sandbox's allowlist "
                f"({', '.join(sorted(_ENV_EXACT))}, {'*, '.join(_ENV_PREFIXES)}*)"
            )


def _map_env(env: dict[str, str], image_python: str) -> dict[str, str]:
    """Host paths in HOME/VLLM_CACHE_ROOT point into a host cache dir; in the container they live in
    the HOME tmpfs. PYTHONPATH is the workspace mount, PATH the image's interpreter first."""
    out = dict(env)
    host_home = env.get("HOME")
    out["HOME"] = SANDBOX_HOME
    if host_home:
        for key, value in env.items():
            if key != "HOME" and (value == host_home or value.startswith(host_home.rstrip("/") + "/")):
                out[key] = SANDBOX_HOME + value[len(host_home.rstrip("/")) :]
    first = f"{PurePosixPath(image_python).parent}:" if PurePosixPath(image_python).is_absolute() else ""
    out["PATH"] = f"{first}/usr/local/bin:/usr/bin:/bin"
    out["PYTHONPATH"] = WORKSPACE_TARGET
    out["TMPDIR"] = "/tmp"
    return out


def _map_argv(argv: tuple[str, ...], image_python: str) -> list[str]:
    """argv[0] is the host's interpreter: use the image's. `--host <loopback>` becomes 0.0.0.0."""
    if not argv:
        raise LaunchFailed("empty argv; the harness builds it from the spec")
    first = argv[0]
    is_python = first == sys.executable or re.fullmatch(r"python(3(\.\d+)?)?", PurePosixPath(first).name)
    out = [image_python if is_python else first, *argv[1:]]
    for i, arg in enumerate(out[:-1]):
        if arg == "--host" and out[i + 1] in ("127.0.0.1", "localhost", "::1"):
            out[i + 1] = "0.0.0.0"
    return out


def _merge_limits(launch: Limits, default: Limits) -> Limits:
    return Limits(
        cpus=launch.cpus if launch.cpus is not None else default.cpus,
        memory_bytes=launch.memory_bytes if launch.memory_bytes is not None else default.memory_bytes,
        pids=launch.pids if launch.pids is not None else default.pids,
        gpus=launch.gpus if launch.gpus != 0 else default.gpus,
    )


def container_args(
    launch: Launch, *, image: str, image_python: str, network: str, name: str, launch_id: str, limits: Limits
) -> dict[str, Any]:
    """Keyword arguments of `client.containers.create` for one launch (pure: unit-tested without docker)."""
    import docker.types

    check_env(launch.env)
    mounts = [docker.types.Mount(target=WORKSPACE_TARGET, source=str(launch.workspace), type="bind", read_only=True)]
    for m in launch.mounts:
        target = PurePosixPath(m.target)
        if not target.is_absolute() or ".." in target.parts:
            raise LaunchFailed(f"mount target {m.target!r} must be an absolute, normalised container path")
        # Nested under the /tmp or HOME tmpfs is fine (docker mounts parents first); hiding one is not.
        if any(PurePosixPath(r).is_relative_to(target) for r in (*_RESERVED_TARGETS, "/tmp", SANDBOX_HOME)) or any(
            target.is_relative_to(r) for r in _RESERVED_TARGETS
        ):
            raise LaunchFailed(
                f"mount target {m.target!r} overlaps a sandbox path "
                f"({', '.join(_RESERVED_TARGETS)}, /tmp, {SANDBOX_HOME})"
            )
        if not m.read_only:
            raise LaunchFailed(
                f"mount {m.source} -> {m.target} asks for write access; the docker sandbox mounts everything read-only"
            )
        mounts.append(
            docker.types.Mount(target=str(target), source=str(Path(m.source).resolve()), type="bind", read_only=True)
        )
    kwargs: dict[str, Any] = {
        "image": image,
        "command": _map_argv(launch.argv, image_python),
        "entrypoint": [],
        "name": name,
        "detach": True,
        "environment": _map_env(launch.env, image_python),
        # .log: the folder of the server's log, so that a resumed campaign finds what its dead run left (reap)
        "labels": {LABEL: "1", f"{LABEL}.launch": launch.name, f"{LABEL}.id": launch_id,
                   f"{LABEL}.log": str(launch.log_path.resolve().parent)},
        "network": network,
        "mounts": mounts,
        "read_only": True,
        # exec: torch.compile loads the C++ it builds from here; the candidate runs arbitrary Python anyway.
        "tmpfs": {"/tmp": "rw,exec,nosuid,nodev,size=2g", SANDBOX_HOME: "rw,exec,nosuid,nodev,size=2g"},
        "working_dir": "/tmp",
        "user": SANDBOX_USER,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "ipc_mode": "private",
        "shm_size": "1g",
        "sysctls": {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"},
        "init": True,  # docker-init as PID 1: signals reach the server, zombies are reaped
        "stdin_open": False,
        "tty": False,
    }
    if limits.pids is not None:
        kwargs["pids_limit"] = int(limits.pids)
    if limits.memory_bytes is not None:
        kwargs["mem_limit"] = int(limits.memory_bytes)
        kwargs["memswap_limit"] = int(limits.memory_bytes)  # no swap: over the limit is an OOM kill
    if limits.cpus is not None:
        kwargs["nano_cpus"] = int(limits.cpus * 1e9)
    if limits.gpus != 0:
        kwargs["device_requests"] = [
            docker.types.DeviceRequest(driver="nvidia", count=limits.gpus, capabilities=[["gpu"]])
        ]
    return kwargs


def _unreadable(root: Path) -> Path | None:
    """The first file or folder under `root` that the sandbox user (not owner, not group) cannot read."""
    if os.stat(root).st_mode & 0o005 != 0o005:
        return root
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            try:
                mode = os.stat(path).st_mode
            except OSError:
                continue
            need = 0o005 if stat.S_ISDIR(mode) else 0o004
            if mode & need != need:
                return path
    return None


def check_readable(launch: Launch) -> None:
    """The container runs as uid 10001: everything it mounts must be world-readable (safetensors files
    are often written 0600). Fails early with the chmod that fixes it."""
    for root in (launch.workspace, *(Path(m.source) for m in launch.mounts)):
        bad = _unreadable(Path(root))
        if bad is not None:
            raise LaunchFailed(
                f"{bad} is not readable by the sandbox user (uid {SANDBOX_USER.split(':')[0]}); "
                f"run `chmod -R a+rX {root}`"
            )


def _firewall(action: str, bridge: str, tag: str) -> None:
    """Only replies may enter the host from the launch's bridge (-I to add, -D to remove)."""
    argv = [
        "iptables",
        "-w",
        "10",
        action,
        "INPUT",
        "-i",
        bridge,
        "-m",
        "conntrack",
        "!",
        "--ctstate",
        "ESTABLISHED,RELATED",
        "-m",
        "comment",
        "--comment",
        tag,
        "-j",
        "DROP",
    ]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=30)
        ok, detail = proc.returncode == 0, proc.stderr.decode(errors="replace").strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, detail = False, str(exc)
    if not ok and action == "-I":
        raise BackendUnavailable(
            f"could not add the host firewall rule for {bridge} ({detail}); the docker "
            f"backend needs root and iptables: run `ratchet sandbox doctor`"
        )


_FREEZE_WAITS_S = (0.5, 1.0, 2.0, 4.0)   # between refused freezes (runc's "unable to freeze")


@dataclass
class DockerRunning:
    launch: Launch
    container: Any
    network: Any
    bridge: str
    base_url: str
    image_id: str
    limits: Limits
    firewall_tag: str
    isolation: str = "docker"
    _state: dict[str, Any] = field(default_factory=dict, repr=False)
    _log_thread: threading.Thread | None = field(default=None, repr=False)
    _stopped: bool = field(default=False, repr=False)
    _stop_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)   # see LocalRunning._lock

    def _refresh(self) -> dict[str, Any]:
        if not self._stopped:
            try:
                self.container.reload()
                self._state = dict(self.container.attrs.get("State", {}))
            except Exception:  # noqa: BLE001 - removed under us: keep the last state we saw
                pass
        return self._state

    def alive(self) -> bool:
        return bool(self._refresh().get("Running", False))

    def collect(self, inner: str, dest: Path) -> list[Path]:
        """The image's own tar (read-only root) streams `inner` out of the container (`docker cp` cannot read
        the /tmp tmpfs); only regular files are extracted, through a temporary folder."""
        import io
        import tarfile
        import tempfile

        try:
            code, (out, _err) = self.container.exec_run(["tar", "-c", "-C", inner, "."], demux=True)
        except Exception:  # noqa: BLE001 - a stopped container: nothing to collect
            return []
        if code != 0 or not out:
            return []
        with tempfile.TemporaryDirectory(prefix="ratchet-collect-") as tmp, \
                tarfile.open(fileobj=io.BytesIO(out)) as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
            tar.extractall(tmp, members=members, filter="data")
            return copy_out(Path(tmp), dest)

    def exit_code(self) -> int | None:
        state = self._refresh()
        if not state or state.get("Running") or state.get("Status") == "created":
            return None
        return int(state.get("ExitCode", -1))

    def oom_killed(self) -> bool:
        return bool(self._refresh().get("OOMKilled", False))

    def describe(self) -> dict[str, object]:
        state = self._refresh()
        return {
            "backend": "docker",
            "isolation": self.isolation,
            "container_id": self.container.id,
            "container_name": self.container.name,
            "image_id": self.image_id,
            "network": self.network.name,
            "bridge": self.bridge,
            "base_url": self.base_url,
            "workspace_target": WORKSPACE_TARGET,
            "limits": {
                "cpus": self.limits.cpus,
                "memory_bytes": self.limits.memory_bytes,
                "pids": self.limits.pids,
                "gpus": self.limits.gpus,
            },
            "state": {
                "status": state.get("Status"),
                "exit_code": state.get("ExitCode"),
                "oom_killed": state.get("OOMKilled"),
                "error": state.get("Error") or None,
            },
        }

    def freeze(self) -> None:
        """The cgroup freezer: every process of the container stops, wherever it forked to. Idempotent:
        the same build measured twice in a row (ABBA order) freezes the other one twice.

        runc gives up ("unable to freeze") when a process stays in uninterruptible sleep through its own
        retries; that happened on a loaded 2-core host in the middle of an A/B and failed a harmless candidate.
        So a refused freeze is tried again after short waits; one that never takes still fails the measurement
        (an A/B with the other build running is not one)."""
        for wait in (*_FREEZE_WAITS_S, None):
            self.container.reload()
            if self.container.status == "paused":
                return
            try:
                self.container.pause()
                return
            except Exception as error:  # noqa: BLE001 - docker's APIError; anything else is re-raised below
                if wait is None or "unable to freeze" not in str(error):
                    raise
                time.sleep(wait)

    def thaw(self) -> None:
        with contextlib.suppress(Exception):   # not paused (or already gone): nothing to thaw
            self.container.unpause()

    def stop(self) -> None:
        """Stop and remove the container, its network and its firewall rule; record why it ended."""
        with self._stop_lock:
            if not self._stopped:
                self._stop()

    def _stop(self) -> None:
        try:
            self.thaw()
            # Already gone or dead: the removal below is what matters.
            with contextlib.suppress(Exception):
                self.container.stop(timeout=_STOP_GRACE_S)
            self._refresh()
            self._stopped = True
            if self._log_thread is not None:
                self._log_thread.join(timeout=10)
            _append_exit_line(self.launch.log_path, self._state)
        finally:
            self._stopped = True
            _remove_quietly(self.container.remove, force=True, v=True)
            _firewall("-D", self.bridge, self.firewall_tag)
            _remove_quietly(self.network.remove)


def _remove_quietly(func: Any, **kwargs: Any) -> None:
    import docker.errors

    with contextlib.suppress(docker.errors.NotFound):
        func(**kwargs)


def _append_exit_line(log_path: Path, state: dict[str, Any]) -> None:
    if not state:
        return
    reason = " (OOM-killed: memory limit reached)" if state.get("OOMKilled") else ""
    with open(log_path, "a") as log:
        log.write(f"[sandbox] container exited with code {state.get('ExitCode')}{reason}\n")


def _stream_logs(container: Any, log_path: Path) -> None:
    """Copy the container's stdout+stderr to the launch's log as it comes (ends when the container does)."""
    try:
        with open(log_path, "ab") as log:
            for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                log.write(chunk)
                log.flush()
    except Exception:  # noqa: BLE001 - container removed mid-stream: the log so far is kept
        pass


@functools.cache
def _this_venv_inputs() -> str:
    """The inputs hash `ratchet sandbox build` gives an image built from this process's venv (cached: it reads
    every installed distribution's RECORD)."""
    from sandbox.image_build import plan_build

    return plan_build().inputs_hash


def resolve_image(client: Any, name: str, *, venv_inputs: Any = _this_venv_inputs) -> Any:
    """The image to run for `name`. An image that `ratchet sandbox build` made carries `ratchet.inputs` and holds
    a copy of the venv it was built from, which the candidate servers run. Two checkouts on one host share the
    tag, so the tag may point at the other checkout's build (its servers then import the wrong trees): the
    image built from this venv is the one to run, whatever the tag points at. An image without the label (a
    vLLM CUDA image, say) runs as named. Raises docker's ImageNotFound when `name` is absent."""
    image = client.images.get(name)
    built_from = (image.labels or {}).get("ratchet.inputs")
    if built_from is None:
        return image
    want = venv_inputs()
    if built_from == want:
        return image
    from sandbox.image_build import find_image

    match = find_image(client, want)
    if match is not None:
        return match
    raise BackendUnavailable(
        f"docker image {name} was built from another venv (ratchet.inputs {built_from}; this venv's is {want}), "
        "e.g. by another checkout on this host; candidate servers would run that venv's copy. Run "
        "`ratchet sandbox build` with this venv")


class DockerBackend:
    """`start()` runs a Launch in a fresh container on a fresh internal network; see the module doc."""

    name = "docker"

    def __init__(self, *, image: str = "ratchet-sandbox:cpu", limits: Limits | None = None, client: Any = None) -> None:
        self.image = image
        self.default_limits = limits or Limits()
        self._client = client

    @classmethod
    def from_spec(cls, config: Any) -> DockerBackend:
        memory = int(config.memory_gb * 2**30) if config.memory_gb is not None else None
        return cls(image=config.image, limits=Limits(cpus=config.cpus, memory_bytes=memory, gpus=config.gpus))

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = connect()
        return self._client

    def image_python(self) -> tuple[str, str]:
        """(image id, interpreter path inside the image)."""
        import docker.errors

        try:
            image = resolve_image(self.client, self.image)
        except docker.errors.ImageNotFound as exc:
            raise BackendUnavailable(
                f"docker image {self.image} not found; build it with `ratchet sandbox build`"
            ) from exc
        labels = image.labels or {}
        return image.id, labels.get(_IMAGE_PYTHON_LABEL, DEFAULT_IMAGE_PYTHON)

    def start(self, launch: Launch) -> DockerRunning:
        import docker.errors

        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        image_id, image_python = self.image_python()
        check_readable(launch)
        launch_id = secrets.token_hex(4)
        slug = re.sub(r"[^a-zA-Z0-9_.-]", "-", launch.name)[:40] or "launch"
        name = f"ratchet-{slug}-{launch_id}"
        bridge = f"rt-{launch_id}"
        limits = _merge_limits(launch.limits, self.default_limits)
        kwargs = container_args(
            launch,
            image=image_id,
            image_python=image_python,
            network=name,
            name=name,
            launch_id=launch_id,
            limits=limits,
        )
        network = self.client.networks.create(
            name,
            driver="bridge",
            internal=True,
            check_duplicate=True,
            labels={LABEL: "1", f"{LABEL}.id": launch_id},
            options={
                "com.docker.network.bridge.name": bridge,
                "com.docker.network.bridge.enable_icc": "false",
            },
        )
        tag = f"ratchet:{name}"
        container = None
        try:
            _firewall("-I", bridge, tag)
            container = self.client.containers.create(**kwargs)
            container.start()
            container.reload()
            ip = container.attrs["NetworkSettings"]["Networks"][name]["IPAddress"]
        except BaseException as exc:
            if container is not None:
                _remove_quietly(container.remove, force=True)
            _firewall("-D", bridge, tag)
            _remove_quietly(network.remove)
            if isinstance(exc, docker.errors.APIError | KeyError):
                raise LaunchFailed(
                    f"container for {launch.name} did not start: {exc}; run `ratchet sandbox doctor`"
                ) from exc
            raise
        thread = threading.Thread(
            target=_stream_logs, args=(container, launch.log_path), name=f"logs-{name}", daemon=True
        )
        thread.start()
        return DockerRunning(
            launch=launch,
            container=container,
            network=network,
            bridge=bridge,
            base_url=f"http://{ip}:{launch.port}",
            image_id=image_id,
            limits=limits,
            firewall_tag=tag,
            _log_thread=thread,
        )


def connect() -> Any:
    """A docker client that answers, or BackendUnavailable saying how to get one."""
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - docker is a declared dependency
        raise BackendUnavailable("the docker SDK is not installed; pip install 'docker>=7.1'") from exc
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here means the same thing to the user
        raise BackendUnavailable(
            f"dockerd is not reachable ({exc}); start it with scripts/start-dockerd.sh or see `ratchet sandbox doctor`"
        ) from exc
    return client


def leftover_containers(client: Any, launch_id: str | None = None) -> list[Any]:
    """Containers (any state) that the backend created, optionally for one launch id."""
    label = f"{LABEL}.id={launch_id}" if launch_id else LABEL
    return list(client.containers.list(all=True, filters={"label": label}))


def reap_containers_under(root: Path) -> int:
    """Remove the containers (and their networks and firewall rules) whose server log lies under `root`:
    what a killed campaign left running. 0 when dockerd does not answer (then there is nothing of ours)."""
    try:
        client = connect()
    except BackendUnavailable:
        return 0
    root = root.resolve()
    removed = 0
    for container in leftover_containers(client):
        log = (container.labels or {}).get(f"{LABEL}.log", "")
        if not log or not Path(log).is_relative_to(root):
            continue
        launch_id = (container.labels or {}).get(f"{LABEL}.id", "")
        _remove_quietly(container.remove, force=True, v=True)
        removed += 1
        _remove_networks(client.networks.list(filters={"label": f"{LABEL}.id={launch_id}"}))
    return removed


def _remove_networks(networks: list[Any]) -> int:
    """Remove labelled networks and the host firewall rule each one has (comment `ratchet:<network>`);
    returns how many rules were removed."""
    rules = 0
    listing = subprocess.run(["iptables", "-w", "10", "-S", "INPUT"], capture_output=True, text=True, timeout=30)
    for network in networks:
        bridge = (network.attrs.get("Options") or {}).get("com.docker.network.bridge.name", "")
        if bridge and f"ratchet:{network.name}" in listing.stdout:
            _firewall("-D", bridge, f"ratchet:{network.name}")
            rules += 1
        _remove_quietly(network.remove)
    return rules


def prune(client: Any) -> dict[str, int]:
    """Remove what a killed harness left behind: labelled containers and networks, and their host
    firewall rules (comment `ratchet:<network>`). Returns how many of each were removed."""
    containers = leftover_containers(client)
    for container in containers:
        _remove_quietly(container.remove, force=True, v=True)
    networks = client.networks.list(filters={"label": LABEL})
    rules = _remove_networks(networks)
    return {"containers": len(containers), "networks": len(networks), "firewall_rules": rules}
