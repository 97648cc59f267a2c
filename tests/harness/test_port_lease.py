from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agent.server_gate import SERVER_PORTS, pick_port
from harness import server
from harness.config import ServerConfig
from harness.errors import PortInUse
from harness.server import port_is_leased, port_lease
from sandbox.base import Launch, Running
from sandbox.errors import LaunchFailed


def test_a_leased_port_is_refused_to_a_second_server_and_skipped_by_the_picker() -> None:
    port = pick_port()
    with port_lease(port):
        assert port_is_leased(port)
        with pytest.raises(PortInUse, match="leased by another ratchet server"), port_lease(port):
            pass
        assert pick_port() != port
    assert not port_is_leased(port) and port in SERVER_PORTS


def test_a_lease_dies_with_its_process() -> None:
    """A killed campaign or Ray worker leaves no stale lease behind: the kernel drops the flock."""
    port = SERVER_PORTS[-1]
    code = f"import os; from harness.server import port_lease\nwith port_lease({port}): os.kill(os.getpid(), 9)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert proc.returncode == -9
    assert not port_is_leased(port)


class _RefusingBackend:
    """Records the port each launch was given, then fails the start (nothing is run)."""
    name = "refusing"

    def __init__(self) -> None:
        self.ports: list[int] = []

    def start(self, launch: Launch) -> Running:
        self.ports.append(launch.port)
        raise LaunchFailed("not started: the test only needs the port")


def _picks_then_listeners(monkeypatch: pytest.MonkeyPatch, busy: int) -> list[socket.socket]:
    """free_port() hands out `busy` listened-on ports first (another process took each between the pick and
    the check), then the real thing."""
    listeners = []
    for _ in range(busy):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        listeners.append(s)
    picks = iter([s.getsockname()[1] for s in listeners])
    real = server.free_port
    monkeypatch.setattr(server, "free_port", lambda: next(picks, None) or real())
    return listeners


def _serve(backend: _RefusingBackend, tmp_path: Path, port: int | None = None) -> None:
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text("{}")
    with server.serve(backend, tree=tmp_path, config=ServerConfig(model=tmp_path / "model", port=port),
                      engine_args={}, log_path=tmp_path / "server.log", cache_dir=tmp_path / "cache"):
        pass


def test_a_free_port_taken_between_pick_and_check_is_picked_again(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    listeners = _picks_then_listeners(monkeypatch, busy=2)
    taken = {s.getsockname()[1] for s in listeners}
    backend = _RefusingBackend()
    with pytest.raises(LaunchFailed):
        _serve(backend, tmp_path)
    assert len(backend.ports) == 1 and backend.ports[0] not in taken
    assert not port_is_leased(backend.ports[0])   # the port is free to others again after the failed start
    for s in listeners:
        s.close()


def test_a_requested_port_in_use_is_refused_not_swapped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The user named the port: another one would not be what they asked for."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        backend = _RefusingBackend()
        with pytest.raises(PortInUse, match="is in use"):
            _serve(backend, tmp_path, port=s.getsockname()[1])
    assert backend.ports == []


def test_free_port_picks_give_up_after_a_bounded_number(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    listeners = _picks_then_listeners(monkeypatch, busy=server.FREE_PORT_PICKS)
    backend = _RefusingBackend()
    with pytest.raises(PortInUse):
        _serve(backend, tmp_path)
    assert backend.ports == []
    for s in listeners:
        s.close()
