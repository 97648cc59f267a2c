"""One backend from a spec's `sandbox:` block, wherever the evaluation runs (the coordinator, or a
Ray worker that rebuilds it from the pickled config: backends hold locks and cannot travel).

`backend: auto` (the default) isolates: Docker where dockerd answers and the sandbox image is built,
else bubblewrap in its own network namespace as an unprivileged user. A host that offers neither is
refused with what to install; running candidate code unisolated takes `backend: unisolated` by name.
`resolve()` turns `auto` into the concrete name once, so that the log records what ran and Ray workers
rebuild the same backend.
"""

from __future__ import annotations

from typing import Any

from sandbox.base import Backend
from sandbox.errors import BackendUnavailable

__all__ = ["backend_from_config", "resolve", "isolation_label", "UNISOLATED"]

UNISOLATED = frozenset({"unisolated"})

# What each concrete backend isolates, in the words the log, summary and report use.
_LABELS = {
    "docker": "docker (own network, read-only root, uid 10001, no capabilities)",
    "bwrap": "bwrap (own network namespace, uid 10001, no capabilities, only the needed paths bound)",
    "unisolated": "none (candidate code runs as this user, unisolated)",
}


def _legacy(config: Any) -> str:
    """`backend: local` of specs and logs written before `auto`: its `local_isolation` says which."""
    return "bwrap" if getattr(config, "local_isolation", "none") == "netns" else "unisolated"


def _docker_ready(image: str) -> str | None:
    """None when dockerd answers and holds `image` built from this venv (or a user's own image); else why not."""
    try:
        from sandbox.docker_backend import connect, resolve_image

        resolve_image(connect(), image)
    except BackendUnavailable as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - ImageNotFound or an API error: docker cannot run it
        return f"image {image} is not built ({type(exc).__name__}); run `ratchet sandbox build`"
    return None


def _bwrap_ready(gpus: int) -> str | None:
    from sandbox.local import LocalBackend

    try:
        LocalBackend.check_netns(gpus=gpus)
    except BackendUnavailable as exc:
        return str(exc)
    return None


def resolve(config: Any) -> Any:
    """`config` with a concrete backend: `auto` picks the strongest isolation this host offers."""
    name = config.backend
    if name == "local":
        name = _legacy(config)
    if name == "auto":
        docker_why = _docker_ready(config.image)
        if docker_why is None:
            name = "docker"
        else:
            bwrap_why = _bwrap_ready(config.gpus)
            if bwrap_why is not None:
                raise BackendUnavailable(
                    "no isolating sandbox on this host, and candidate code is never run unisolated by default. "
                    f"docker: {docker_why}. bwrap: {bwrap_why}. Fix one (./setup.sh installs and starts "
                    "dockerd and builds the image), or set sandbox.backend: unisolated to run candidates "
                    "as this user")
            name = "bwrap"
    return config.model_copy(update={"backend": name})


def isolation_label(config: Any) -> str:
    name = config.backend if config.backend != "local" else _legacy(config)
    return _LABELS.get(name, name)


def backend_from_config(config: Any) -> Backend:
    """`config` is the spec's SandboxConfig (backend, image, limits); `auto` is resolved here if the
    caller has not already."""
    config = resolve(config)
    if config.backend in ("unisolated", "bwrap"):
        from sandbox.local import LocalBackend

        return LocalBackend(isolation="netns" if config.backend == "bwrap" else "none", gpus=config.gpus)
    from sandbox.docker_backend import DockerBackend

    return DockerBackend.from_spec(config)
