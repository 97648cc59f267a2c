"""The server not being measured is frozen: every process of it stops (also a child that left its process
group), nothing answers, and thawing brings it back unchanged."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from harness.config import ServerConfig
from harness.server import serve
from sandbox.base import Launch
from sandbox.docker_backend import DockerBackend
from sandbox.local import LocalBackend

# A "server" that starts a CPU burner in a session of its own, as a candidate could while the other
# build is measured, and tells where it is.
BURNER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
print("burner", child.pid, flush=True)
time.sleep(120)
"""

def _serve(backend: Any, tree: Path, model: Path, log: Path, *argv: str) -> Any:
    return serve(backend, tree=tree, config=ServerConfig(model=model, startup_timeout_s=60), engine_args={},
                 log_path=log, cache_dir=log.parent / "cache", extra_argv=tuple(argv), python=sys.executable)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_frozen_local_server_stops_all_its_processes_and_thaws_back(fake_tree: Path, fake_model: Path,
                                                                      tmp_path: Path) -> None:
    with _serve(LocalBackend(), fake_tree, fake_model, tmp_path / "s.log") as server:
        root = psutil.Process(int(server.running.describe()["pid"]))  # type: ignore[call-overload]
        members = [root, *root.children(recursive=True)]
        server.running.freeze()
        assert all(p.status() == psutil.STATUS_STOPPED for p in members)
        assert not _answers(server.base_url)
        server.running.thaw()
        assert all(p.status() != psutil.STATUS_STOPPED for p in members)
        assert _answers(server.base_url)


def test_a_burner_that_left_the_process_group_is_frozen_too(tmp_path: Path) -> None:
    import time

    log = tmp_path / "burner.log"
    running = LocalBackend().start(Launch(name="burner", argv=(sys.executable, "-c", BURNER), workspace=tmp_path,
                                          env={}, port=1, log_path=log))
    try:
        deadline = time.monotonic() + 30
        while "burner" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        burner = psutil.Process(int(log.read_text().split()[1]))
        assert burner.status() != psutil.STATUS_STOPPED
        running.freeze()
        assert burner.status() == psutil.STATUS_STOPPED
        running.thaw()
        assert burner.status() != psutil.STATUS_STOPPED
    finally:
        running.stop()
    deadline = time.monotonic() + 10     # SIGKILL is delivered asynchronously
    while burner.is_running() and burner.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not burner.is_running() or burner.status() == psutil.STATUS_ZOMBIE     # stop() killed it too


def test_a_frozen_server_is_stopped_cleanly(fake_tree: Path, fake_model: Path, tmp_path: Path) -> None:
    """stop() thaws first: a stopped process would hold SIGTERM until the grace period ran out."""
    with _serve(LocalBackend(), fake_tree, fake_model, tmp_path / "s.log") as server:
        pid = int(server.running.describe()["pid"])  # type: ignore[call-overload]
        server.running.freeze()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.docker
def test_a_frozen_container_is_paused_and_unpaused(sandbox_image: str, docker_client: Any, fake_tree: Path,
                                                    fake_model: Path, tmp_path: Path) -> None:
    with _serve(DockerBackend(image=sandbox_image), fake_tree, fake_model, tmp_path / "d.log") as server:
        container = docker_client.containers.get(server.running.describe()["container_id"])
        server.running.freeze()
        server.running.freeze()       # the same build measured twice in a row freezes the other one twice
        container.reload()
        assert container.attrs["State"]["Paused"] is True
        assert not _answers(server.base_url)
        server.running.thaw()
        container.reload()
        assert container.attrs["State"]["Paused"] is False and _answers(server.base_url)


class _Container:
    """Stands in for docker's Container: pause is refused the way runc refuses it under load, `refusals` times."""

    def __init__(self, refusals: int, message: str = "OCI runtime pause failed: unable to freeze: unknown") -> None:
        self.status, self.refusals, self.message, self.pauses = "running", refusals, message, 0

    def reload(self) -> None:
        pass

    def pause(self) -> None:
        self.pauses += 1
        if self.refusals:
            self.refusals -= 1
            raise RuntimeError(f'500 Server Error: Internal Server Error ("Cannot pause container: {self.message}")')
        self.status = "paused"


def _running(container: _Container) -> Any:
    from sandbox.docker_backend import DockerRunning

    return DockerRunning(launch=None, container=container, network=None, bridge="", base_url="", image_id="",
                         limits=None, firewall_tag="")  # type: ignore[arg-type]


def test_a_freeze_refused_under_load_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import sandbox.docker_backend as docker_backend

    monkeypatch.setattr(docker_backend, "_FREEZE_WAITS_S", (0.0, 0.0, 0.0))
    container = _Container(refusals=2)
    _running(container).freeze()
    assert container.status == "paused" and container.pauses == 3


def test_a_freeze_that_never_takes_fails_the_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    import sandbox.docker_backend as docker_backend

    monkeypatch.setattr(docker_backend, "_FREEZE_WAITS_S", (0.0, 0.0))
    container = _Container(refusals=10)
    with pytest.raises(RuntimeError, match="unable to freeze"):
        _running(container).freeze()
    assert container.pauses == 3
    other = _Container(refusals=1, message="No such container")   # not the freezer's hiccup: no retry
    with pytest.raises(RuntimeError, match="No such container"):
        _running(other).freeze()
    assert other.pauses == 1
