"""Real vLLM servers on the CPU: start, evidence, clean kill, and each failure mode's message."""

from __future__ import annotations

import socket
import threading
import urllib.request
from pathlib import Path

import pytest

from harness.bench import BenchJob, run_jobs
from harness.config import BenchmarkConfig, Cell, ServerConfig
from harness.errors import BenchmarkFailed, PortInUse, ServerCrashed, ServerNotReady
from harness.server import Server, serve, tree_digest
from sandbox.local import LocalBackend
from tests.conftest import processes_under

ENGINE = {"enforce_eager": True, "dtype": "float32", "max_model_len": 2048}
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def _config(model: Path, **kw: object) -> ServerConfig:
    return ServerConfig(model=model, env=ENV, **kw)  # type: ignore[arg-type]


def test_a_port_in_use_is_refused_before_anything_starts(random_model: Path, vllm_workspace: Path,
                                                         tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortInUse, match=f"port {port} is in use"), \
                serve(LocalBackend(), tree=vllm_workspace, config=_config(random_model, port=port),
                      engine_args=ENGINE, log_path=tmp_path / "s.log", cache_dir=tmp_path / "c"):
            pass


def test_a_model_folder_without_config_is_a_clear_error(vllm_workspace: Path, tmp_path: Path) -> None:
    with pytest.raises(ServerNotReady, match="has no config.json"), \
            serve(LocalBackend(), tree=vllm_workspace, config=_config(tmp_path), engine_args=ENGINE,
                  log_path=tmp_path / "s.log", cache_dir=tmp_path / "c"):
        pass


@pytest.mark.vllm
def test_a_server_that_is_not_healthy_in_time_is_killed_with_its_children(
        random_model: Path, vllm_workspace: Path, no_orphans: Path) -> None:
    with pytest.raises(ServerNotReady, match="not ready after 8 s"), \
            serve(LocalBackend(), tree=vllm_workspace, config=_config(random_model, startup_timeout_s=8),
                  engine_args=ENGINE, log_path=no_orphans / "s.log", cache_dir=no_orphans / "c"):
        pass


@pytest.mark.vllm
def test_a_crash_during_start_up_reports_the_log_tail(random_model: Path, vllm_workspace: Path,
                                                      no_orphans: Path) -> None:
    too_long = {**ENGINE, "max_model_len": 1_000_000}   # beyond the model's max positions: vLLM refuses
    with pytest.raises(ServerCrashed, match="(?s)during start-up.*max_model_len"), \
            serve(LocalBackend(), tree=vllm_workspace, config=_config(random_model), engine_args=too_long,
                  log_path=no_orphans / "s.log", cache_dir=no_orphans / "c"):
        pass


@pytest.mark.vllm
def test_the_server_runs_the_workspace_tree_and_a_crash_mid_benchmark_is_reported(
        random_model: Path, vllm_workspace: Path, no_orphans: Path) -> None:
    bench = BenchmarkConfig(input_lens=[64], output_lens=[256], num_prompts=16, max_concurrency=2, num_warmups=0)
    with serve(LocalBackend(), tree=vllm_workspace, config=_config(random_model), engine_args=ENGINE,
               log_path=no_orphans / "s.log", cache_dir=no_orphans / "c") as server:
        assert Path(str(server.evidence["vllm_file"])).is_relative_to(vllm_workspace)
        assert server.evidence["gemma4_sha256"] == tree_digest(vllm_workspace) != ""
        assert server.startup_s > 0
        job = BenchJob(cell=Cell(input_len=64, output_len=256), base_url=server.base_url,
                       model_name=server.model_name, tokenizer=random_model, tag="A", repeat=0)
        # Killed once the server itself reports requests in flight: a fixed delay raced the client's import
        # time and, on a fast host, fired after both runs had finished.
        done = threading.Event()
        killed = threading.Event()
        killer = threading.Thread(target=_stop_once_busy, args=(server, done, killed), daemon=True)
        killer.start()
        try:
            with pytest.raises((ServerCrashed, BenchmarkFailed)):
                run_jobs([job, job], bench, work_dir=no_orphans / "bench",
                         check_alive=lambda _job: server.check_alive())
        finally:
            done.set()
            killer.join(timeout=30)
        assert killed.is_set(), "the server was never seen busy: the kill did not land mid-run"
    assert not processes_under(no_orphans)


def _stop_once_busy(server: Server, done: threading.Event, killed: threading.Event) -> None:
    """Stops the server the first time its /metrics shows a running request."""
    while not done.wait(0.2):
        try:
            with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=5) as reply:
                metrics = reply.read().decode()
        except OSError:
            continue
        if any(line.startswith("vllm:num_requests_running") and float(line.rsplit(" ", 1)[1]) > 0
               for line in metrics.splitlines()):
            server.running.stop()
            killed.set()
            return
