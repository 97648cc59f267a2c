"""The local backend's netns+bwrap variant: reachable from the host on its /30, not the other way, no
outside route, host filesystem read-only, host sockets hidden; the namespace is gone after stop."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.config import ServerConfig
from harness.errors import ServerNotReady
from harness.server import serve
from sandbox.errors import BackendUnavailable
from sandbox.host_tools import HostTools, host_tools
from sandbox.local import LocalBackend


def _tools() -> HostTools | None:
    """The backend's own tools (PATH's, or an offline GPU host's unpacked ones: RATCHET_SANDBOX_TOOLS)."""
    try:
        return host_tools()
    except BackendUnavailable:
        return None


TOOLS = _tools()
if os.geteuid() != 0 or TOOLS is None:
    if os.environ.get("CI"):
        pytest.fail(
            "local netns tests need root, iproute2, bubblewrap and iptables (apt-get install -y "
            "bubblewrap iptables, or RATCHET_SANDBOX_TOOLS naming a folder of them unpacked)",
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
    assert TOOLS is not None
    return subprocess.run([*TOOLS.ip, "netns", "list"], capture_output=True, text=True, check=True).stdout


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
            assert server.evidence["isolation"] == "bwrap (netns, uid 10001)"
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


def test_a_bwrap_candidate_sees_no_key_log_prompts_or_other_tree(
    fake_tree: Path, fake_model: Path, tmp_path: Path
) -> None:
    """Only the paths a server needs exist in there, and it runs as uid 10001: a world-readable log, the
    held prompts, another build's tree and the harness are absent; root's 0600 key is unreadable even if
    it were bound. The host's own files were made readable first, so absence is the sandbox's doing."""
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    (secrets_dir / "signing.key").write_text("key")
    (secrets_dir / "signing.key").chmod(0o600)
    log = tmp_path / "log" / "audit.jsonl"
    log.parent.mkdir()
    log.write_text("{}")
    other = tmp_path / "other-tree" / "vllm"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    repo = Path(__file__).resolve().parents[2]
    targets = [secrets_dir / "signing.key", log, other / "__init__.py",
               repo / "experiments" / "prompts" / "gemma4-tiny-parity.jsonl", repo / "harness" / "bench.py",
               Path("/root/.ssh/id_rsa")]
    for path in targets[1:5]:
        assert path.read_bytes() is not None   # readable on the host
    with _serve(fake_tree, fake_model, tmp_path / "run" / "read.log", "--attack", "read", "--targets",
                ",".join(map(str, targets))) as s:
        report = httpx.get(f"{s.base_url}/report", timeout=10).json()
    assert report["uid"] == 10001, report
    for path in targets:
        assert report[str(path)] in ("ENOENT", "EACCES"), (path, report)
    assert not report["cwd"].startswith(str(tmp_path)), report
