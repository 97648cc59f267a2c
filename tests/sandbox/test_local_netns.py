"""The local backend's netns+bwrap variant: reachable from the host on its /30, not the other way, no
outside route, host filesystem read-only, host sockets hidden; the namespace is gone after stop."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.config import ServerConfig
from harness.errors import ServerNotReady
from harness.server import serve
from sandbox.local import LocalBackend

if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "bwrap", "iptables")):
    if os.environ.get("CI"):
        pytest.fail(
            "local netns tests need root, iproute2, bubblewrap and iptables (apt-get install -y "
            "bubblewrap iptables)",
            pytrace=False,
        )
    pytest.skip("needs root, ip, bwrap, iptables", allow_module_level=True)


def _serve(tree: Path, model: Path, log: Path, *argv: str, timeout_s: float = 60) -> Any:
    config = ServerConfig(model=model, startup_timeout_s=timeout_s)
    return serve(
        LocalBackend(isolation="netns"),
        tree=tree,
        config=config,
        engine_args={},
        log_path=log,
        cache_dir=log.parent / "cache",
        extra_argv=tuple(argv),
    )


def _netns_names() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def test_a_netns_candidate_is_reachable_but_reaches_nothing(
    fake_tree: Path, fake_model: Path, tmp_path: Path, host_listener: int, host_ipv4: list[str]
) -> None:  # noqa: F811
    with _serve(fake_tree, fake_model, tmp_path / "peer.log") as peer:
        peer_target = peer.base_url.removeprefix("http://")
        targets = [f"{ip}:{host_listener}" for ip in host_ipv4] + [peer_target]
        with _serve(
            fake_tree,
            fake_model,
            tmp_path / "net.log",
            "--attack",
            "network",
            "--host-port",
            str(host_listener),
            "--targets",
            ",".join(targets),
        ) as server:
            assert server.evidence["isolation"] == "local-netns+bwrap"
            report = httpx.get(f"{server.base_url}/report", timeout=10).json()
            name = server.running.describe()["netns"]["name"]  # type: ignore[index]
            assert name in _netns_names()
    assert report["default_route"] is False
    attempts = {k: v for k, v in report.items() if ":" in k}
    assert len(attempts) >= len(targets) + 2 and all(v != "connected" for v in attempts.values()), report
    assert name not in _netns_names()


def test_a_netns_candidate_cannot_write_the_host_or_see_its_sockets(
    fake_tree: Path, fake_model: Path, tmp_path: Path
) -> None:
    with _serve(
        fake_tree, fake_model, tmp_path / "write.log", "--attack", "write", "--model", str(fake_model)
    ) as s:
        report = httpx.get(f"{s.base_url}/report", timeout=10).json()
    for target in ("workspace", "workspace_edit", "image_site_packages", "etc_passwd", "root_dir", "model"):
        assert report[target] in ("EROFS", "EACCES"), (target, report)
    assert report["tmp"] == "written" and report["home"] == "written"
    assert report["docker_sock_visible"] is False
    assert int(report["cap_eff"], 16) == 0 and report["no_new_privs"] == "1"
    assert "pwned" not in (fake_tree / "vllm" / "__init__.py").read_text()


def test_a_stuck_netns_candidate_is_cleaned_up(fake_tree: Path, fake_model: Path, tmp_path: Path) -> None:
    before = _netns_names()
    with (
        pytest.raises(ServerNotReady),
        _serve(fake_tree, fake_model, tmp_path / "stuck.log", "--attack", "never_healthy", timeout_s=3),
    ):
        pass
    assert _netns_names() == before
