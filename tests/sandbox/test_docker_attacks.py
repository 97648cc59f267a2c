"""The attack table against the docker backend, through the harness's own `serve()`.

Each candidate is the stand-in vLLM of fake_vllm/ (stdlib http.server) with `--attack KIND`. For each:
the attack is contained, the container (and its network) is gone afterwards, the reason is reported,
and the next candidate starts and answers normally. No test sends traffic beyond this machine: every
address a candidate tries is one of the host's own or another local container's.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from harness.config import ServerConfig
from harness.errors import ServerCrashed, ServerNotReady
from harness.server import Server, serve
from sandbox.base import Limits
from sandbox.docker_backend import LABEL, DockerBackend

pytestmark = pytest.mark.docker


def _serve(
    backend: DockerBackend,
    tree: Path,
    model: Path,
    log: Path,
    *argv: str,
    timeout_s: float = 60,
    limits: Limits | None = None,
) -> Any:
    config = ServerConfig(model=model, startup_timeout_s=timeout_s)
    return serve(
        backend,
        tree=tree,
        config=config,
        engine_args={},
        log_path=log,
        cache_dir=log.parent / "cache",
        extra_argv=tuple(argv),
        limits=limits,
    )


def _report(server: Server) -> dict[str, Any]:
    return dict(httpx.get(f"{server.base_url}/report", timeout=10).json())


def _assert_removed(client: Any, name: str) -> None:
    assert client.containers.list(all=True, filters={"label": f"{LABEL}.launch={name}"}) == []
    assert [n for n in client.networks.list(filters={"label": LABEL}) if name in n.name] == []


def _assert_next_candidate_runs(backend: DockerBackend, tree: Path, model: Path, tmp_path: Path) -> None:
    with _serve(backend, tree, model, tmp_path / "next.log") as server:
        assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


@pytest.fixture
def backend(sandbox_image: str) -> DockerBackend:
    return DockerBackend(image=sandbox_image)


def test_a_healthy_candidate_is_reachable_from_the_host_and_reports_docker(
    backend: DockerBackend, docker_client: Any, fake_tree: Path, fake_model: Path, tmp_path: Path
) -> None:
    with _serve(backend, fake_tree, fake_model, tmp_path / "ok.log") as server:
        info = server.running.describe()
        assert server.evidence["isolation"] == "docker"
        assert server.evidence["vllm_file"] == "/workspace/vllm/__init__.py"
        assert info["workspace_target"] == "/workspace"
        container = docker_client.containers.get(info["container_id"])
        host = container.attrs["HostConfig"]
        assert host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"]
        assert "no-new-privileges" in host["SecurityOpt"]
        assert container.attrs["Config"]["User"] == "10001:10001"
        assert docker_client.networks.get(info["network"]).attrs["Internal"] is True
        assert host["PortBindings"] in ({}, None)  # nothing published on the host's interfaces
    _assert_removed(docker_client, "ok")


def test_a_candidate_cannot_reach_the_host_other_candidates_or_the_outside(
    backend: DockerBackend,
    docker_client: Any,
    fake_tree: Path,
    fake_model: Path,
    tmp_path: Path,
    host_listener: int,
    host_ipv4: list[str],
) -> None:
    with _serve(backend, fake_tree, fake_model, tmp_path / "peer.log") as peer:
        peer_target = peer.base_url.removeprefix("http://")
        targets = [f"{ip}:{host_listener}" for ip in host_ipv4] + [peer_target]
        with _serve(
            backend,
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
            report = _report(server)
            bridge = server.running.describe()["bridge"]
            rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout
            # Packets for anywhere beyond the bridge are dropped by docker's isolation rules
            # (internal network) and new connections to the host by the backend's INPUT rule.
            assert re.search(rf"^-A DOCKER-ISOLATION-STAGE-1 ! -d \S+ -i {bridge} -j DROP$", rules, re.M), (
                rules
            )
            assert f"-A INPUT -i {bridge}" in rules
        # Reaching a peer through the host (its published base_url) is what the harness does; from
        # inside another candidate's container it must fail.
        assert httpx.get(f"{peer.base_url}/health", timeout=5).status_code == 200
    attempts = {k: v for k, v in report.items() if ":" in k}
    assert len(attempts) >= len(targets) + 1
    assert all(v != "connected" for v in attempts.values()), report
    _assert_removed(docker_client, "net")
    _assert_removed(docker_client, "peer")
    _assert_next_candidate_runs(backend, fake_tree, fake_model, tmp_path)


def test_a_fork_bomb_is_contained_by_the_pids_limit(
    backend: DockerBackend, docker_client: Any, fake_tree: Path, fake_model: Path, tmp_path: Path
) -> None:
    with _serve(
        backend,
        fake_tree,
        fake_model,
        tmp_path / "fork.log",
        "--attack",
        "fork",
        limits=Limits(pids=64, memory_bytes=1 << 30),
    ) as server:
        report = _report(server)
        host_pids = len(psutil.pids())
    assert report["fork_error"] == "EAGAIN" and report["forked"] < 64, report
    assert host_pids < 100_000
    _assert_removed(docker_client, "fork")
    _assert_next_candidate_runs(backend, fake_tree, fake_model, tmp_path)


def test_unbounded_allocation_is_oom_killed_and_reported(
    backend: DockerBackend, docker_client: Any, fake_tree: Path, fake_model: Path, tmp_path: Path
) -> None:
    log = tmp_path / "oom.log"
    with (
        pytest.raises(ServerCrashed, match="code 137") as caught,
        _serve(
            backend, fake_tree, fake_model, log, "--attack", "memory", limits=Limits(memory_bytes=256 << 20)
        ),
    ):
        pass
    assert "allocated" in str(caught.value)
    assert "OOM-killed" in log.read_text()
    _assert_removed(docker_client, "oom")
    _assert_next_candidate_runs(backend, fake_tree, fake_model, tmp_path)


def test_writes_outside_tmp_and_home_fail_and_privileges_are_dropped(
    backend: DockerBackend, docker_client: Any, fake_tree: Path, fake_model: Path, tmp_path: Path
) -> None:
    before = sorted(p.name for p in (fake_tree / "vllm").iterdir())
    with _serve(
        backend,
        fake_tree,
        fake_model,
        tmp_path / "write.log",
        "--attack",
        "write",
        "--model",
        str(fake_model),
    ) as server:
        report = _report(server)
    for target in ("workspace", "workspace_edit", "image_site_packages", "etc_passwd", "root_dir", "model"):
        assert report[target] in ("EROFS", "EACCES"), (target, report)
    assert report["tmp"] == "written" and report["home"] == "written"
    assert report["docker_sock_visible"] is False
    assert report["uid"] == 10001 and int(report["cap_eff"], 16) == 0 and report["no_new_privs"] == "1"
    assert sorted(p.name for p in (fake_tree / "vllm").iterdir()) == before
    assert "pwned" not in (fake_tree / "vllm" / "__init__.py").read_text()
    _assert_removed(docker_client, "write")
    _assert_next_candidate_runs(backend, fake_tree, fake_model, tmp_path)


def test_a_candidate_that_never_becomes_healthy_is_removed(
    backend: DockerBackend, docker_client: Any, fake_tree: Path, fake_model: Path, tmp_path: Path
) -> None:
    with (
        pytest.raises(ServerNotReady, match="not ready after 5 s"),
        _serve(
            backend, fake_tree, fake_model, tmp_path / "stuck.log", "--attack", "never_healthy", timeout_s=5
        ),
    ):
        pass
    _assert_removed(docker_client, "stuck")
    _assert_next_candidate_runs(backend, fake_tree, fake_model, tmp_path)
