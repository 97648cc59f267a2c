from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from harness.engine_args import ENGINE_ARG_TYPES
from harness.engine_defaults import effective_engine_args
from harness.errors import EngineArgRejected, EngineDefaultsUnknown
from tests.conftest import TINY_MODEL

SPEC_ARGS: dict[str, object] = {"dtype": "float32", "max_model_len": 4096, "enforce_eager": True}


def _model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(TINY_MODEL / "config.json", model / "config.json")
    return model


def _script(tmp_path: Path, body: str) -> str:
    """An executable standing in for the interpreter: the failures vLLM itself is too slow to stage."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.vllm
def test_the_embedded_checkpoint_resolves_chunked_prefill_and_max_num_seqs() -> None:
    effective = effective_engine_args(TINY_MODEL, SPEC_ARGS, env={"VLLM_CPU_KVCACHE_SPACE": "2"})
    assert effective["enable_chunked_prefill"] is True          # vLLM V1's default: setting it is a no-op
    assert isinstance(effective["max_num_seqs"], int) and effective["max_num_seqs"] > 0
    assert isinstance(effective["max_num_batched_tokens"], int)
    assert effective["stream_interval"] == 1                    # each token streamed: proposing 1 is a no-op
    assert effective["api_server_count"] == 1                   # one API server in front of one engine
    assert effective["distributed_executor_backend"] == "mp"    # vLLM CPU: the worker in a process of its own
    assert {k: effective[k] for k in SPEC_ARGS} == SPEC_ARGS   # explicit keys are their own effective value
    assert set(effective) <= set(ENGINE_ARG_TYPES)


@pytest.mark.vllm
def test_what_the_platform_overrides_is_what_is_in_force() -> None:
    # vLLM CPU has no CUDA graphs and forces async scheduling off: asking for either changes nothing, and
    # the campaign refuses such a serving.yaml-only candidate as a no-op (agent/serving_campaign.py) instead of an A/B
    asked = {**SPEC_ARGS, "enforce_eager": False, "cudagraph_mode": "PIECEWISE", "max_cudagraph_capture_size": 64,
             "async_scheduling": True, "distributed_executor_backend": "uni"}
    effective = effective_engine_args(TINY_MODEL, asked, env={"VLLM_CPU_KVCACHE_SPACE": "2"})
    assert effective["cudagraph_mode"] == "NONE" and effective["async_scheduling"] is False
    assert effective["max_cudagraph_capture_size"] == 64 and effective["enforce_eager"] is False
    # `uni` alone is turned back into `mp` on a CPU host; with the spec's env saying so, it is in force
    assert effective["distributed_executor_backend"] == "mp"
    in_process = effective_engine_args(TINY_MODEL, {**SPEC_ARGS, "distributed_executor_backend": "uni"},
                                       env={"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert in_process["distributed_executor_backend"] == "uni"


def test_a_model_directory_without_config_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EngineDefaultsUnknown, match=r"no config.json; check server.model"):
        effective_engine_args(tmp_path / "no-such-model", SPEC_ARGS)


def test_a_key_off_the_allowlist_is_rejected_before_vllm_runs(tmp_path: Path) -> None:
    with pytest.raises(EngineArgRejected, match="not allowed"):
        effective_engine_args(_model_dir(tmp_path), {"tensor_parallel_size": 2})


def test_an_interpreter_that_cannot_run_says_which_python_to_pass(tmp_path: Path) -> None:
    with pytest.raises(EngineDefaultsUnknown, match="pass the python of the environment vLLM is installed in"):
        effective_engine_args(_model_dir(tmp_path), SPEC_ARGS, python=str(tmp_path / "bin" / "python"))


def test_a_failed_resolution_reports_the_exit_code_and_stderr(tmp_path: Path) -> None:
    python = _script(tmp_path, "echo 'ValueError: max_num_seqs must be positive' >&2; exit 3")
    with pytest.raises(EngineDefaultsUnknown, match=r"(?s)exit code 3.*max_num_seqs must be positive"):
        effective_engine_args(_model_dir(tmp_path), SPEC_ARGS, python=python)


def test_a_hung_resolution_is_killed_at_its_timeout(tmp_path: Path) -> None:
    python = _script(tmp_path, "sleep 30")
    started = time.monotonic()
    with pytest.raises(EngineDefaultsUnknown, match="did not finish in 0.5 s"):
        effective_engine_args(_model_dir(tmp_path), SPEC_ARGS, python=python, timeout_s=0.5)
    assert time.monotonic() - started < 10


def test_values_off_the_allowlist_types_are_left_out(tmp_path: Path) -> None:
    """A resolved value of the wrong type (another vLLM's None or enum) is absent, not guessed."""
    line = 'RATCHET_EFFECTIVE {"max_num_seqs": 128, "block_size": "128", "async_scheduling": null}'
    python = _script(tmp_path, f"echo '{line}'")
    assert effective_engine_args(_model_dir(tmp_path), SPEC_ARGS, python=python) == {**SPEC_ARGS, "max_num_seqs": 128}

