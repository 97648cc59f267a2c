"""The serving-config allowlist. A candidate may change engine args only through the workspace's
serving.yaml, and only these keys with these types; everything the measurement depends on (model,
port, prefix caching, seed, served name, load format) is fixed by the harness."""

from __future__ import annotations

import json
from collections.abc import Mapping

from harness.errors import EngineArgRejected

__all__ = ["API_SERVER_COUNT_MAX", "CUDAGRAPH_MODES", "EXECUTOR_BACKENDS",
           "ENGINE_ARG_TYPES", "ENV_ALLOWLIST", "SPEC_OWNED", "engine_argv", "check_engine_args",
           "check_env", "spec_owned_changes"]

# key -> accepted python type(s). Booleans become --flag / --no-flag.
ENGINE_ARG_TYPES: dict[str, tuple[type, ...]] = {
    "dtype": (str,),
    "max_model_len": (int,),
    "max_num_seqs": (int,),
    "max_num_batched_tokens": (int,),
    "enable_chunked_prefill": (bool,),
    "enforce_eager": (bool,),
    "block_size": (int,),
    "kv_cache_dtype": (str,),
    "gpu_memory_utilization": (float, int),
    "kv_cache_memory_bytes": (int,),     # a fixed KV cache: no profiling of free memory (servers that start together)
    "async_scheduling": (bool,),
    "attention_backend": (str,),
    "compilation_config": (str,),       # JSON string, as vLLM's CLI takes it
    "cudagraph_mode": (str,),           # compilation_config's cudagraph_mode, one of CUDAGRAPH_MODES
    "max_cudagraph_capture_size": (int,),
    "max_seq_len_to_capture": (int,),
    "cuda_graph_sizes": (str,),
    "disable_cascade_attn": (bool,),
    "long_prefill_token_threshold": (int,),
    "max_num_partial_prefills": (int,),
    "scheduling_policy": (str,),
    "stream_interval": (int,),           # tokens per streamed chunk: less API-server work per token, same tokens
    "api_server_count": (int,),          # API-server processes in front of one engine (1..API_SERVER_COUNT_MAX)
    "distributed_executor_backend": (str,),   # one of EXECUTOR_BACKENDS
    "load_format": (str,),               # only "auto" or "dummy" (_CHOICES)
}

# More API-server processes split the per-token streaming work of many concurrent requests; a bound keeps a
# candidate from starting a process storm on the host.
API_SERVER_COUNT_MAX = 8

# How the engine runs its one worker: `mp` in a process of its own (vLLM's default), `uni` inside the engine's
# process, one spawned process fewer (each imports torch and vLLM anew: ~10 s of a tiny model's ~40-s start on a
# two-core CPU host, measured in Docker). vLLM's CPU platform keeps `mp` unless the server's env also sets
# VLLM_ENABLE_V1_MULTIPROCESSING=0 (its OpenMP thread binding is the mp worker's). Ray and external launchers are
# left out: a cluster of their own, outside the sandbox.
EXECUTOR_BACKENDS = ("mp", "uni")

# vLLM's CUDAGraphMode names. cudagraph_mode is a key of its own (not hidden in a compilation_config string) so that
# vLLM's resolved mode can be compared with it; it reaches vLLM inside --compilation-config.
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")

# The string keys that take one of a fixed set of values. load_format: real weights or vLLM's dummy ones (speed
# runs only); the other formats read weights a spec did not name.
_CHOICES: dict[str, tuple[str, ...]] = {
    "load_format": ("auto", "dummy"),
    "cudagraph_mode": CUDAGRAPH_MODES,
    "distributed_executor_backend": EXECUTOR_BACKENDS,
}

# Environment variables a spec (never a candidate) may pass to the server.
ENV_ALLOWLIST = frozenset({
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_CPU_NUM_OF_RESERVED_CPU",
    "VLLM_CPU_ATTN_SPLIT_KV",
    "OMP_NUM_THREADS",
    "VLLM_ATTENTION_BACKEND",
    "VLLM_LOGGING_LEVEL",
    "CUDA_VISIBLE_DEVICES",
    "VLLM_USE_FLASHINFER_SAMPLER",     # 0 skips the FlashInfer sampler's JIT build (~96 s per cold GPU start)
    "VLLM_ENABLE_V1_MULTIPROCESSING",  # 0: lets distributed_executor_backend uni take effect on a CPU host
})

# Keys that trade accuracy or the other build's share of the machine rather than speed: a candidate may
# change them only when the spec names them in server.candidate_may_change (and parity's logprob check then
# judges the precision it runs at). load_format is never a candidate's: dummy weights are the spec's choice.
SPEC_OWNED = frozenset({"dtype", "kv_cache_dtype", "gpu_memory_utilization", "kv_cache_memory_bytes", "load_format"})

_FIXED = {"model", "port", "host", "enable_prefix_caching", "seed", "served_model_name", "trust_remote_code",
          "tokenizer", "download_dir", "uds"}


def check_engine_args(args: Mapping[str, object]) -> dict[str, object]:
    clean: dict[str, object] = {}
    for key, value in args.items():
        if key in _FIXED:
            raise EngineArgRejected(f"engine arg {key!r} is fixed by the harness and cannot be set")
        types = ENGINE_ARG_TYPES.get(key)
        if types is None:
            allowed = ", ".join(sorted(ENGINE_ARG_TYPES))
            raise EngineArgRejected(f"engine arg {key!r} is not allowed; allowed: {allowed}")
        # bool is an int subclass: reject True for an int field and 1 for a bool field.
        if isinstance(value, bool) != (bool in types) or not isinstance(value, types):
            raise EngineArgRejected(f"engine arg {key}={value!r}: expected {'/'.join(t.__name__ for t in types)}")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise EngineArgRejected(f"engine arg {key}={value!r}: expected one of {', '.join(_CHOICES[key])}")
        if key == "api_server_count" and not 1 <= value <= API_SERVER_COUNT_MAX:
            raise EngineArgRejected(f"engine arg api_server_count={value}: expected 1..{API_SERVER_COUNT_MAX}")
        if isinstance(value, str) and (value.startswith("-") or "\n" in value):
            raise EngineArgRejected(f"engine arg {key}={value!r} looks like a flag or spans lines")
        clean[key] = value
    if "cudagraph_mode" in clean and "compilation_config" in clean:
        raise EngineArgRejected("engine args cudagraph_mode and compilation_config are both set: put cudagraph_mode "
                                "inside compilation_config, or drop compilation_config")
    return clean


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    for key in env:
        if key not in ENV_ALLOWLIST:
            raise EngineArgRejected(f"server env {key!r} is not allowed; allowed: {', '.join(sorted(ENV_ALLOWLIST))}")
    return dict(env)


def engine_argv(args: Mapping[str, object]) -> list[str]:
    argv: list[str] = []
    for key, value in sorted(check_engine_args(args).items()):
        flag = "--" + key.replace("_", "-")
        if key == "cudagraph_mode":
            argv += ["--compilation-config", json.dumps({"cudagraph_mode": value})]
        elif isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            argv += [flag, str(value)]
    return argv


def spec_owned_changes(incumbent: Mapping[str, object], candidate: Mapping[str, object],
                       allowed: frozenset[str] = frozenset()) -> list[str]:
    """The spec-owned keys (SPEC_OWNED, less `allowed`) whose value the candidate changed, added or removed."""
    return sorted(k for k in SPEC_OWNED - allowed if incumbent.get(k) != candidate.get(k))
