"""Running.collect: what a server wrote under a path of its own view comes out as regular files only (no
links to host files), on every backend; the server itself never writes into the harness's folders."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.config import ServerConfig
from harness.server import serve
from sandbox.base import copy_out
from sandbox.local import LocalBackend


def _collect(backend: Any, tree: Path, model: Path, tmp_path: Path) -> list[str]:
    config = ServerConfig(model=model, startup_timeout_s=60)
    with serve(backend, tree=tree, config=config, engine_args={}, log_path=tmp_path / "run" / "s.log",
               cache_dir=tmp_path / "cache", extra_argv=("--attack", "tmpfiles")) as server:
        got = server.running.collect("/tmp/ratchet-collect", tmp_path / "out")
    return sorted(p.name for p in got)


def test_copy_out_skips_links_and_stops_at_the_limit(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "a.json").write_text("x" * 10)
    (src / "b.json").write_text("y" * 10)
    (src / "passwd").symlink_to("/etc/passwd")
    (src / "etc").symlink_to("/etc")
    assert sorted(p.name for p in copy_out(src, tmp_path / "o1")) == ["a.json", "b.json"]
    assert len(copy_out(src, tmp_path / "o2", limit=15)) == 1


def test_unisolated_collect(fake_tree: Path, fake_model: Path, tmp_path: Path) -> None:
    shutil.rmtree("/tmp/ratchet-collect", ignore_errors=True)
    assert _collect(LocalBackend(), fake_tree, fake_model, tmp_path) == ["trace.json"]
    shutil.rmtree("/tmp/ratchet-collect", ignore_errors=True)


def test_bwrap_collect_reads_the_sandboxs_own_tmp(fake_tree: Path, fake_model: Path, tmp_path: Path) -> None:
    try:
        LocalBackend.check_netns()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"bwrap sandbox unavailable: {exc}")
    shutil.rmtree("/tmp/ratchet-collect", ignore_errors=True)
    assert _collect(LocalBackend(isolation="netns"), fake_tree, fake_model, tmp_path) == ["trace.json"]
    assert not Path("/tmp/ratchet-collect").exists()      # it was the sandbox's /tmp, not the host's


@pytest.mark.docker
def test_docker_collect_copies_out_of_the_container(sandbox_image: str, fake_tree: Path, fake_model: Path,
                                                    tmp_path: Path) -> None:
    from sandbox.docker_backend import DockerBackend

    assert _collect(DockerBackend(image=sandbox_image), fake_tree, fake_model, tmp_path) == ["trace.json"]
