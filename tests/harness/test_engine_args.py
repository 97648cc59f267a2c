from __future__ import annotations

import pytest

from harness.engine_args import check_env, engine_argv
from harness.errors import EngineArgRejected


def test_allowed_args_become_flags_in_a_stable_order() -> None:
    argv = engine_argv({"max_num_seqs": 8, "enforce_eager": True, "enable_chunked_prefill": False})
    assert argv == ["--enable-chunked-prefill", "--no-enable-chunked-prefill"][1:] + [
        "--enforce-eager", "--max-num-seqs", "8"]


@pytest.mark.parametrize("key", ["model", "port", "enable_prefix_caching", "trust_remote_code", "seed"])
def test_fixed_args_cannot_be_set_by_a_candidate(key: str) -> None:
    with pytest.raises(EngineArgRejected, match="fixed by the harness"):
        engine_argv({key: "x"})


@pytest.mark.parametrize("args", [
    {"not_an_arg": 1},
    {"max_num_seqs": True},          # bool where an int is expected
    {"enforce_eager": 1},            # int where a bool is expected
    {"dtype": "--trust-remote-code"},  # value smuggling a flag
    {"load_format": "runai_streamer"},
    {"cudagraph_mode": "full"},                  # vLLM's names only, as spelled
    {"cudagraph_mode": "FULL", "compilation_config": '{"mode": 3}'},   # the string would overwrite it
    {"api_server_count": 0},
    {"api_server_count": 64},                    # a process storm on the host, not a serving config
    {"distributed_executor_backend": "ray"},     # a cluster of its own, outside the sandbox
])
def test_bad_engine_args_are_rejected(args: dict[str, object]) -> None:
    with pytest.raises(EngineArgRejected):
        engine_argv(args)


@pytest.mark.parametrize("key", ["LD_PRELOAD", "PYTHONPATH", "PYTHONSTARTUP", "HOME"])
def test_server_env_outside_the_allowlist_is_rejected(key: str) -> None:
    with pytest.raises(EngineArgRejected):
        check_env({key: "x"})


def test_cuda_graph_knobs_are_keys_of_their_own_and_reach_vllm_as_its_cli_takes_them() -> None:
    argv = engine_argv({"cudagraph_mode": "FULL_DECODE_ONLY", "max_cudagraph_capture_size": 256})
    assert argv == ["--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}',
                    "--max-cudagraph-capture-size", "256"]


def test_api_server_count_reaches_vllm_as_its_cli_flag() -> None:
    assert engine_argv({"api_server_count": 4}) == ["--api-server-count", "4"]


def test_the_executor_backend_reaches_vllm_as_its_cli_flag() -> None:
    assert engine_argv({"distributed_executor_backend": "uni"}) == ["--distributed-executor-backend", "uni"]
    assert check_env({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}) == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
