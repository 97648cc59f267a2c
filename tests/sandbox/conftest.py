"""Fixtures for the docker sandbox tests (the client and the built CPU image: tests/conftest.py)."""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

FAKE_VLLM = Path(__file__).parent / "fake_vllm"


@pytest.fixture
def fake_tree(tmp_path: Path) -> Path:
    """A tree holding the stand-in `vllm` package (readable by the sandbox user)."""
    tree = tmp_path / "tree"
    shutil.copytree(FAKE_VLLM, tree, ignore=shutil.ignore_patterns("__pycache__"))
    return tree


@pytest.fixture
def fake_model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A TCP listener on all host addresses, counting connections that reach it."""
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, peer = sock.accept()
            except OSError:
                continue
            accepted.append(peer)
            conn.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    stop.set()
    thread.join(timeout=2)
    sock.close()
    assert accepted == [], f"a sandboxed candidate reached the host listener from {accepted}"


@pytest.fixture
def host_ipv4() -> list[str]:
    """The host's own non-loopback IPv4 addresses (what a candidate might try to reach)."""
    return sorted(
        {
            a.address
            for addrs in psutil.net_if_addrs().values()
            for a in addrs
            if a.family == socket.AF_INET and not a.address.startswith("127.")
        }
    )
