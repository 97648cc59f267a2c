"""The container arguments the docker backend builds (no dockerd needed): isolation settings, the env
allowlist, interpreter and --host mapping, mounts, limits and GPU device requests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from sandbox.base import Launch, Limits, Mount
from sandbox.docker_backend import WORKSPACE_TARGET, check_readable, container_args
from sandbox.errors import LaunchFailed

PY = "/opt/ratchet/venv/bin/python"


def _launch(tmp_path: Path, **kw: Any) -> Launch:
    base = dict(
        name="cand",
        argv=(sys.executable, "-c", "pass", "--host", "127.0.0.1", "--port", "8000"),
        workspace=tmp_path,
        env={
            "HOME": "/host/cache",
            "VLLM_CACHE_ROOT": "/host/cache/vllm",
            "PATH": "/usr/bin",
            "VLLM_CPU_KVCACHE_SPACE": "1",
        },
        port=8000,
        log_path=tmp_path / "s.log",
    )
    base.update(kw)
    return Launch(**base)  # type: ignore[arg-type]


def _args(launch: Launch, limits: Limits | None = None) -> dict[str, Any]:
    return container_args(
        launch,
        image="img",
        image_python=PY,
        network="net",
        name="c",
        launch_id="id",
        limits=limits or launch.limits,
    )


def test_isolation_settings(tmp_path: Path) -> None:
    a = _args(_launch(tmp_path))
    assert a["read_only"] is True and a["cap_drop"] == ["ALL"] and a["security_opt"] == ["no-new-privileges"]
    assert a["user"] == "10001:10001" and a["network"] == "net" and a["pids_limit"] == 4096
    assert "ports" not in a and "privileged" not in a
    assert set(a["tmpfs"]) == {"/tmp", "/home/sandbox"}
    ws = a["mounts"][0]
    assert ws["Target"] == WORKSPACE_TARGET and ws["ReadOnly"] is True and ws["Source"] == str(tmp_path)


def test_interpreter_host_and_env_are_mapped(tmp_path: Path) -> None:
    a = _args(_launch(tmp_path))
    assert a["command"][0] == PY
    assert a["command"][a["command"].index("--host") + 1] == "0.0.0.0"
    env = a["environment"]
    assert env["HOME"] == "/home/sandbox" and env["VLLM_CACHE_ROOT"] == "/home/sandbox/vllm"
    assert env["PYTHONPATH"] == WORKSPACE_TARGET and env["PATH"].startswith("/opt/ratchet/venv/bin:")
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"


@pytest.mark.parametrize(
    "key",
    [
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PYTHONINSPECT",
        "BASH_ENV",
        "PYTHONPATH",
        "LD_AUDIT",
        "SOMETHING_ELSE",
    ],
)
def test_env_outside_the_allowlist_is_refused(tmp_path: Path, key: str) -> None:
    launch = _launch(tmp_path, env={"HOME": "/h", key: "x"})
    with pytest.raises(LaunchFailed, match=key):
        _args(launch)


def test_mounts_are_read_only_and_may_not_hide_sandbox_paths(tmp_path: Path) -> None:
    a = _args(_launch(tmp_path, mounts=(Mount(source=tmp_path, target="/tmp/model"),)))
    assert a["mounts"][1]["Target"] == "/tmp/model" and a["mounts"][1]["ReadOnly"] is True
    for target in ("/tmp", "/", "/workspace/x", "/etc", "relative", "/home"):
        with pytest.raises(LaunchFailed, match="mount target"):
            _args(_launch(tmp_path, mounts=(Mount(source=tmp_path, target=target),)))
    with pytest.raises(LaunchFailed, match="write access"):
        _args(_launch(tmp_path, mounts=(Mount(source=tmp_path, target="/data", read_only=False),)))


def test_limits_and_gpu_device_requests(tmp_path: Path) -> None:
    a = _args(_launch(tmp_path), Limits(cpus=1.5, memory_bytes=2 << 30, pids=256, gpus=2))
    assert a["nano_cpus"] == 1_500_000_000 and a["mem_limit"] == 2 << 30 and a["memswap_limit"] == 2 << 30
    assert a["pids_limit"] == 256
    (req,) = a["device_requests"]
    assert req["Driver"] == "nvidia" and req["Count"] == 2 and req["Capabilities"] == [["gpu"]]
    all_gpus = _args(_launch(tmp_path), Limits(gpus=-1))["device_requests"][0]
    assert all_gpus["Count"] == -1
    assert "device_requests" not in _args(_launch(tmp_path), Limits())


def test_files_the_sandbox_user_cannot_read_are_reported_with_the_fix(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"x")
    (model / "model.safetensors").chmod(0o600)
    launch = _launch(tmp_path / "ws", workspace=model, mounts=())
    with pytest.raises(LaunchFailed, match="chmod -R a\\+rX"):
        check_readable(launch)
    (model / "model.safetensors").chmod(0o644)
    check_readable(launch)


def test_an_image_without_the_python_label_uses_python3_from_its_path(tmp_path: Path) -> None:
    a = container_args(
        _launch(tmp_path),
        image="vllm/vllm-openai:v0.32.0",
        image_python="python3",
        network="net",
        name="c",
        launch_id="id",
        limits=Limits(),
    )
    assert a["command"][0] == "python3"
    assert a["environment"]["PATH"] == "/usr/local/bin:/usr/bin:/bin"


class _Image:
    def __init__(self, image_id: str, inputs: str | None) -> None:
        self.id = image_id
        self.labels = {"ratchet.inputs": inputs} if inputs else {}


class _Images:
    """docker's images API as resolve_image uses it: get by name, list by label."""

    def __init__(self, tags: dict[str, _Image], all_images: list[_Image]) -> None:
        self.tags, self.all = tags, all_images

    def get(self, name: str) -> _Image:
        import docker.errors

        if name not in self.tags:
            raise docker.errors.ImageNotFound(name)
        return self.tags[name]

    def list(self, filters: dict[str, str]) -> list[_Image]:
        want = filters["label"].removeprefix("ratchet.inputs=")
        return [i for i in self.all if i.labels.get("ratchet.inputs") == want]


class _Client:
    def __init__(self, tags: dict[str, _Image], all_images: list[_Image]) -> None:
        self.images = _Images(tags, all_images)


def test_the_image_built_from_this_venv_runs_even_when_another_checkout_moved_the_tag() -> None:
    import docker.errors

    from sandbox.docker_backend import resolve_image
    from sandbox.errors import BackendUnavailable

    ours, theirs = _Image("sha256:ours", "aaaa"), _Image("sha256:theirs", "bbbb")
    mine = lambda: "aaaa"  # noqa: E731 - this venv's inputs hash
    assert resolve_image(_Client({"ratchet-sandbox:cpu": ours}, [ours, theirs]), "ratchet-sandbox:cpu",
                         venv_inputs=mine) is ours
    # another clone's `ratchet sandbox build` moved the shared tag: ours is still found by its label
    assert resolve_image(_Client({"ratchet-sandbox:cpu": theirs}, [ours, theirs]), "ratchet-sandbox:cpu",
                         venv_inputs=mine) is ours
    # and when no image was built from this venv, the servers would run another venv: refused, with the fix
    with pytest.raises(BackendUnavailable, match="ratchet sandbox build"):
        resolve_image(_Client({"ratchet-sandbox:cpu": theirs}, [theirs]), "ratchet-sandbox:cpu", venv_inputs=mine)
    # a user's own image (no label: a vLLM CUDA image) runs as named, and an absent one says so
    cuda = _Image("sha256:cuda", None)
    assert resolve_image(_Client({"vllm/vllm-openai:v0.26.0": cuda}, [cuda]), "vllm/vllm-openai:v0.26.0",
                         venv_inputs=mine) is cuda
    with pytest.raises(docker.errors.ImageNotFound):
        resolve_image(_Client({}, []), "ratchet-sandbox:cpu", venv_inputs=mine)
