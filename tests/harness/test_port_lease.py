from __future__ import annotations

import subprocess
import sys

import pytest

from agent.server_gate import SERVER_PORTS, pick_port
from harness.errors import PortInUse
from harness.server import port_is_leased, port_lease


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
