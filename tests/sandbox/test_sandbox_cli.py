"""`ratchet sandbox doctor` and `ratchet sandbox build` against the real dockerd."""

from __future__ import annotations

import time

import pytest

from agent.cli import main

pytestmark = pytest.mark.docker


def test_doctor_passes_with_dockerd_and_the_image(
    sandbox_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sandbox", "doctor", "--image", sandbox_image]) == 0
    assert "the docker backend can run here" in capsys.readouterr().out


def test_doctor_names_the_missing_image_and_the_fix(
    docker_client: object, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sandbox", "doctor", "--image", "ratchet-sandbox:absent"]) != 0
    out = capsys.readouterr()
    assert "ratchet sandbox build" in out.out and "cannot run here" in out.err


def test_build_is_skipped_when_an_image_with_the_same_inputs_exists(
    sandbox_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import docker

    from sandbox.image_build import find_image, plan_build

    if find_image(docker.from_env(), plan_build().inputs_hash) is None:
        pytest.skip("the image was built from other inputs; `ratchet sandbox build` first")
    started = time.monotonic()
    assert main(["sandbox", "build"]) == 0
    assert "already built" in capsys.readouterr().out
    assert time.monotonic() - started < 60


def test_a_tag_moved_to_another_venvs_build_still_runs_this_venvs_image(sandbox_image: str,
                                                                       docker_client: object) -> None:
    """Two checkouts on one host share the tag: when the other one's build holds it, the backend still runs
    the image built from this venv (found by its ratchet.inputs label), and the doctor says so."""
    import io
    import tarfile

    from sandbox.docker_backend import resolve_image
    from sandbox.image_build import find_image, plan_build

    ours = find_image(docker_client, plan_build().inputs_hash)
    if ours is None:
        pytest.skip("no image is built from this venv; `ratchet sandbox build` first")
    empty = io.BytesIO()
    tarfile.open(fileobj=empty, mode="w").close()
    api = docker_client.api  # type: ignore[attr-defined]
    api.import_image_from_data(empty.getvalue(), repository="ratchet-test-moved", tag="cpu",
                               changes=['LABEL ratchet.inputs="another-venv"'])
    try:
        assert resolve_image(docker_client, "ratchet-test-moved:cpu").id == ours.id
        assert main(["sandbox", "doctor", "--image", "ratchet-test-moved:cpu"]) == 0
    finally:
        docker_client.images.remove("ratchet-test-moved:cpu", force=True)  # type: ignore[attr-defined]
