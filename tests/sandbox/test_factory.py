"""`sandbox.backend: auto` isolates: docker where it can run, else bwrap, else a refusal that says what
to install; unisolated only by name, and never for the llm proposer."""

from __future__ import annotations

from pathlib import Path

import pytest

import sandbox.factory as factory
from agent.campaign import with_resolved_sandbox
from agent.spec import SandboxConfig, SpecError, load_spec
from sandbox.errors import BackendUnavailable

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_is_auto_and_the_shipped_specs_use_it() -> None:
    assert SandboxConfig().backend == "auto"
    for name in ("gemma4-tiny-cpu.yaml", "gemma4-e2b-gpu.yaml", "gemma4-e2b-gpu-campaign.yaml",
                 "gemma4-tiny-cpu-ray.yaml", "replay-demo-cpu.yaml", "gemma4-tiny-mm-cpu.yaml",
                 "gemma4-e2b-gpu-mm.yaml"):
        assert load_spec(ROOT / "experiments" / name).sandbox.backend == "auto", name


def test_auto_prefers_docker_then_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(factory, "_docker_ready", lambda image: None)
    monkeypatch.setattr(factory, "_bwrap_ready", lambda gpus: None)
    assert factory.resolve(SandboxConfig()).backend == "docker"
    monkeypatch.setattr(factory, "_docker_ready", lambda image: "dockerd is not reachable")
    assert factory.resolve(SandboxConfig()).backend == "bwrap"
    assert "uid 10001" in factory.isolation_label(factory.resolve(SandboxConfig()))


def test_auto_without_an_isolating_backend_is_refused_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(factory, "_docker_ready", lambda image: "dockerd is not reachable")
    monkeypatch.setattr(factory, "_bwrap_ready", lambda gpus: "bwrap not found; apt-get install -y bubblewrap")
    with pytest.raises(BackendUnavailable) as err:
        factory.resolve(SandboxConfig())
    text = str(err.value)
    assert "dockerd is not reachable" in text and "apt-get install -y bubblewrap" in text
    assert "sandbox.backend: unisolated" in text and "./setup.sh" in text


def test_named_backends_and_the_legacy_local_name_resolve_without_probing(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: object) -> str:
        raise AssertionError("a named backend must not be probed as auto")

    monkeypatch.setattr(factory, "_docker_ready", boom)
    assert factory.resolve(SandboxConfig(backend="unisolated")).backend == "unisolated"
    assert factory.resolve(SandboxConfig(backend="local")).backend == "unisolated"
    assert factory.resolve(SandboxConfig(backend="local", local_isolation="netns")).backend == "bwrap"
    assert factory.isolation_label(SandboxConfig(backend="unisolated")).startswith("none")


def test_the_llm_proposer_refuses_unisolated_candidates() -> None:
    spec = load_spec(ROOT / "experiments" / "gemma4-tiny-cpu.yaml")
    unisolated = spec.model_copy(update={"sandbox": SandboxConfig(backend="unisolated")})
    with pytest.raises(SpecError, match="llm proposer refuses sandbox.backend: unisolated"):
        with_resolved_sandbox(unisolated, "llm")
    assert with_resolved_sandbox(unisolated, "search").sandbox.backend == "unisolated"
