"""One real vLLM server through the docker backend: the random tiny Gemma 4, the workspace overlay at
/workspace (read-only), /health from the host over the launch's internal bridge, and one completion."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from harness.config import ServerConfig
from harness.server import serve
from sandbox.docker_backend import DockerBackend
from sandbox.workspace import Workspace

pytestmark = [pytest.mark.docker, pytest.mark.vllm, pytest.mark.slow]


def _world_readable(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            (Path(dirpath) / name).chmod(0o755)
        for name in filenames:
            (Path(dirpath) / name).chmod(0o644)


def test_vllm_serves_the_tiny_model_from_the_workspace_inside_docker(
    sandbox_image: str, docker_client: object, tmp_path: Path
) -> None:
    from tests.tiny_random_model import write_random_gemma4

    model = tmp_path / "model"
    write_random_gemma4(model)
    _world_readable(model)  # safetensors are written 0600; the sandbox user is uid 10001
    ws = Workspace.create(tmp_path / "ws", serving={})
    config = ServerConfig(
        model=model,
        engine_args={"enforce_eager": True, "max_model_len": 512, "dtype": "float32"},
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        startup_timeout_s=420,
    )
    log = tmp_path / "server.log"
    with serve(
        DockerBackend(image=sandbox_image),
        tree=ws.root,
        config=config,
        engine_args=dict(config.engine_args),
        log_path=log,
        cache_dir=tmp_path / "cache",
    ) as server:
        assert server.evidence["isolation"] == "docker"
        assert server.evidence["vllm_file"] == "/workspace/vllm/__init__.py"
        assert server.evidence["gemma4_sha256"] == server.evidence["host_gemma4_sha256"]
        assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
        reply = httpx.post(
            f"{server.base_url}/v1/completions",
            timeout=120,
            json={"model": server.model_name, "prompt": "t1 t2 t3 t4", "max_tokens": 4, "temperature": 0},
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4
