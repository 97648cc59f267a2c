"""`ratchet export mlflow`: a real campaign log as one MLflow run, in a real local MLflow store (sqlite) and
through a real MLflow tracking server over HTTP; only a log that verifies is exported."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import mlflow  # the mlflow extra: ./setup.sh test installs it
import pytest

from agent.cli import main
from audit import verify
from audit.facts import campaign_facts
from tests.audit.conftest import unpack_run1


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return unpack_run1(tmp_path / "logs")


def _export(log: Path, uri: str, *extra: str) -> int:
    return main(["export", "mlflow", str(log), "--tracking-uri", uri, "--no-anchor", *extra])


def _runs(uri: str) -> list[mlflow.entities.Run]:
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("ratchet")
    return client.search_runs([experiment.experiment_id]) if experiment else []


def test_a_campaign_becomes_one_run_with_its_params_metrics_and_evidence(log: Path, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert _export(log, uri) == 0
    (run,) = _runs(uri)
    client = mlflow.MlflowClient(tracking_uri=uri)
    facts = campaign_facts(log)
    assert run.info.run_name == facts.campaign and run.info.status == "FINISHED"
    assert run.data.tags["ratchet.campaign"] == facts.campaign and run.data.tags["ratchet.verified"] == "true"
    assert run.data.tags["ratchet.verdict"] == "improved"
    params = run.data.params
    assert params["spec"] == "gemma4-tiny-cpu" and params["env.vllm"] == "0.32.0"
    assert params["engine.enforce_eager"] == "True" and params["proposer"] == "search"
    history = client.get_metric_history(run.info.run_id, "speedup")
    assert [m.step for m in history] == [1, 2, 3] and round(history[-1].value, 3) == 1.357
    assert [m.value for m in client.get_metric_history(run.info.run_id, "accepted")] == [0.0, 0.0, 1.0]
    assert round(run.data.metrics["final/speedup"], 3) == 1.367
    assert round(run.data.metrics["final/in1024/out64/speedup"], 3) == 1.464
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"audit", "accepted", "report.html", "summary.md", "final_comparison.json"} <= names
    # the exported audit folder is enough to verify the log again, away from the campaign's machine
    local = Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="audit",
                                                    dst_path=str(tmp_path / "back"), tracking_uri=uri))
    assert verify(local).ok
    assert local.is_dir() and (tmp_path / "mlruns").is_dir()  # a local store keeps artifacts beside its database
    diff = Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, tracking_uri=uri,
                                                   artifact_path="accepted/iteration-3.diff",
                                                   dst_path=str(tmp_path / "diff"))).read_text()
    assert diff == facts.iterations[2].diff


def test_a_second_export_needs_replace(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert _export(log, uri) == 0
    (first,) = _runs(uri)
    assert _export(log, uri) == 2
    assert f"already run {first.info.run_id}" in capsys.readouterr().err
    assert _export(log, uri, "--replace") == 0
    (second,) = _runs(uri)
    assert second.info.run_id != first.info.run_id


def test_a_log_that_does_not_verify_is_not_exported(log: Path, tmp_path: Path) -> None:
    lines = (log / "log.jsonl").read_bytes().splitlines(keepends=True)
    (log / "log.jsonl").write_bytes(b"".join(lines[:5] + lines[6:]))  # a record removed
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert _export(log, uri) == 1
    assert _runs(uri) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_export_to_a_tracking_server_over_http(log: Path, tmp_path: Path) -> None:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}", "--artifacts-destination",
         str(tmp_path / "artifacts")], stdout=subprocess.DEVNULL, stderr=(tmp_path / "server.log").open("w"))
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            try:
                if httpx.get(f"{uri}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        else:
            pytest.fail("mlflow server did not come up: " + (tmp_path / "server.log").read_text()[-2000:])
        assert _export(log, uri) == 0
        (run,) = _runs(uri)
        assert run.data.tags["ratchet.campaign"] == campaign_facts(log).campaign
        assert any(a.path == "report.html" for a in mlflow.MlflowClient(uri).list_artifacts(run.info.run_id))
    finally:
        server.terminate()
        server.wait(timeout=30)
