"""Shared fixtures. Markers (vllm, docker, gpu, slow) are declared in pyproject.toml."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = ROOT / "experiments" / "models" / "gemma4-tiny"


@pytest.fixture(scope="session")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight 2-layer Gemma 4 (speed only: its greedy tokens are near ties)."""
    from tests.tiny_random_model import write_random_gemma4

    return write_random_gemma4(tmp_path_factory.mktemp("random-gemma4"))


@pytest.fixture(scope="session")
def vllm_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One git workspace of the installed vLLM, shared read-only by the session's server tests."""
    from sandbox.workspace import Workspace

    root = tmp_path_factory.mktemp("ws") / "workspace"
    Workspace.create(root, serving={"enforce_eager": True, "dtype": "float32", "max_model_len": 2048})
    return root


def write_prompts(path: Path, n: int = 6, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n):
            ids = [rng.randrange(3, 256) for _ in range(rng.choice([16, 48, 96]))]
            f.write(json.dumps({"id": f"p{i}", "prompt_token_ids": ids}) + "\n")
    return path


def write_spec(directory: Path, *, model: Path, workspace: Path, prompts: Path, extra: str = "") -> Path:
    spec = directory / "spec.yaml"
    spec.write_text(f"""
schema_version: 1
name: test-spec
server:
  model: {model}
  engine_args: {{enforce_eager: true, dtype: float32, max_model_len: 2048}}
  env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
  startup_timeout_s: 300
benchmark:
  input_lens: [64]
  output_lens: [8]
  num_prompts: 8
  max_concurrency: 4
  num_warmups: 1
  repeats: 2
parity:
  prompts: {prompts}
  max_tokens: 8
target:
  workspace: {workspace}
{extra}""")
    return spec


def processes_under(directory: Path) -> list[psutil.Process]:
    """Server processes of logs inside `directory`: their working directory is the server folder the harness
    made for that log (sandbox/local.py's server_cwd), or lies inside `directory` itself."""
    from sandbox.reap import owned_server_cwds

    roots = [directory.resolve(), *owned_server_cwds(directory)]
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            cwd = Path(proc.cwd()).resolve()
            if any(cwd.is_relative_to(root) for root in roots):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _unavailable(why: str) -> None:
    """Outside CI a missing dockerd or image skips the docker tests with the command that fixes it; in CI (env CI
    set) it fails, because CI starts dockerd (scripts/start-dockerd.sh) and builds the image."""
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A client for a running dockerd."""
    from sandbox.docker_backend import connect
    from sandbox.errors import BackendUnavailable

    try:
        client = connect()
    except BackendUnavailable as exc:
        _unavailable(f"{exc}")
    yield client
    client.close()


@pytest.fixture(scope="session")
def sandbox_image(docker_client: Any) -> str:
    """The built CPU sandbox image (a full vllm-cpu install in /opt/ratchet/venv)."""
    from sandbox.image_build import DEFAULT_TAG

    try:
        docker_client.images.get(DEFAULT_TAG)
    except Exception:  # noqa: BLE001
        _unavailable(f"image {DEFAULT_TAG} absent; run `ratchet sandbox build`")
    return DEFAULT_TAG


@pytest.fixture
def no_orphans(tmp_path: Path) -> Iterator[Path]:
    """A work folder; after the test, no process may still run inside it."""
    yield tmp_path
    left = processes_under(tmp_path)
    for proc in left:
        proc.kill()
    assert not left, f"orphan processes left behind: {[p.pid for p in left]}"
