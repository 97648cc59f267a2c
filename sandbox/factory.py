"""One backend from a spec's `sandbox:` block, wherever the evaluation runs (the coordinator, or a
Ray worker that rebuilds it from the pickled config: backends hold locks and cannot travel)."""

from __future__ import annotations

from typing import Any

from sandbox.base import Backend

__all__ = ["backend_from_config"]


def backend_from_config(config: Any) -> Backend:
    """`config` is the spec's SandboxConfig (backend, image, limits, local_isolation)."""
    if config.backend == "local":
        from sandbox.local import LocalBackend

        return LocalBackend.from_spec(config)
    from sandbox.docker_backend import DockerBackend

    return DockerBackend.from_spec(config)
