"""The sandbox image build's disk hygiene, against a stand-in for the docker client: a full disk is named before
the import, and the images no venv here would run are removed (never a tagged one, one still in use, or the new
one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sandbox import image_build
from sandbox.errors import SandboxError
from sandbox.image_build import VENV_LABEL, check_room, prune_orphaned_images

INPUTS = "ratchet.inputs"


@dataclass
class Image:
    id: str
    labels: dict[str, str]
    tags: list[str] = field(default_factory=list)


class Images:
    def __init__(self, images: list[Image], in_use: set[str]) -> None:
        self.images, self.in_use = images, in_use
        self.removed: list[str] = []

    def list(self, filters: dict[str, str]) -> list[Image]:
        assert filters == {"label": VENV_LABEL}
        return [i for i in self.images if VENV_LABEL in i.labels]

    def remove(self, image: str, noprune: bool = False) -> None:
        if image in self.in_use:
            raise RuntimeError("conflict: unable to delete (must be forced) - image is being used")
        self.removed.append(image)


class Client:
    def __init__(self, root: str = "", images: list[Image] | None = None, in_use: set[str] | None = None):
        self.root = root
        self.images = Images(images or [], in_use or set())

    def info(self) -> dict[str, Any]:
        return {"DockerRootDir": self.root}


def _venv(tmp_path: Path, name: str) -> str:
    (tmp_path / name / "bin").mkdir(parents=True)
    (tmp_path / name / "bin" / "python").touch()
    return str(tmp_path / name)


def test_only_untagged_unused_images_no_venv_here_runs_are_removed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    live, moved = _venv(tmp_path, "live"), _venv(tmp_path, "rebuilt")
    odd = _venv(tmp_path, "cannot-be-probed")
    gone = str(tmp_path / "deleted-checkout" / ".venv")
    hashes = {live: "h-live", moved: "h-after-a-dependency-change"}

    def plan(venv: Path) -> SimpleNamespace:
        if str(venv) not in hashes:
            raise SandboxError("probing the venv failed")
        return SimpleNamespace(inputs_hash=hashes[str(venv)])

    monkeypatch.setattr(image_build, "plan_build", plan)
    images = [
        Image("sha256:new", {VENV_LABEL: gone}),                            # the build's own image: kept
        Image("sha256:live", {VENV_LABEL: live, INPUTS: "h-live"}),         # another checkout still runs it
        Image("sha256:odd", {VENV_LABEL: odd, INPUTS: "?"}),                # its venv cannot be probed: kept
        Image("sha256:tagged", {VENV_LABEL: gone}, ["mine:cpu"]),           # someone tagged it
        Image("sha256:busy", {VENV_LABEL: gone}),                           # a container runs it
        Image("sha256:orphan", {VENV_LABEL: gone}),                         # its venv is gone
        Image("sha256:stale", {VENV_LABEL: moved, INPUTS: "h-before"}),     # its venv has other packages now
        Image("sha256:old", {INPUTS: "x"}),                                 # built before the label: left alone
    ]
    client = Client(images=images, in_use={"sha256:busy"})
    said: list[str] = []
    removed = prune_orphaned_images(client, keep="sha256:new", progress=lambda what, *_: said.append(what))
    assert removed == ["sha256:orphan", "sha256:stale"] and client.images.removed == removed
    assert any("kept sha256:busy" in s for s in said) and any(gone in s for s in said)


def test_a_disk_too_full_for_the_image_is_named_before_the_import(tmp_path: Path) -> None:
    free = __import__("shutil").disk_usage(tmp_path).free
    with pytest.raises(SandboxError, match=r"not enough disk for the sandbox image.*docker image prune"):
        check_room(Client(root=str(tmp_path)), need=free)
    check_room(Client(root=str(tmp_path)), need=0)                  # room enough: no error
    check_room(Client(root=str(tmp_path / "absent")), need=free)   # a remote daemon's root: not measured here
