"""The engine args vLLM actually resolves for a serving config: explicit keys and the defaults in force.

A search proposer that only sees `serving.yaml` cannot tell that `enable_chunked_prefill: true` is already
vLLM V1's default, or that `max_num_seqs: 128` is the CPU platform's; proposing either costs a full A/B on
a no-op. `effective_engine_args` asks the installed (pristine) vLLM in a subprocess: it parses the same
argv the harness gives the server with vLLM's own CLI parser and builds the engine config the way the
OpenAI server does (`AsyncEngineArgs.from_cli_args(...).create_engine_config(OPENAI_API_SERVER)`).
That is a config resolution only: the model's config.json is read, no weights are loaded, no server runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from harness.engine_args import ENGINE_ARG_TYPES, check_env, engine_argv
from harness.errors import EngineDefaultsUnknown
from harness.server import SERVER_ENV

__all__ = ["RESOLVED_KEYS", "effective_engine_args"]

_TAG = "RATCHET_EFFECTIVE "
# allowlist key -> (config attribute of VllmConfig, field). Keys not here (attention_backend: the backend in
# use is picked at model load; compilation_config, cuda_graph_sizes: not comparable to the CLI string (its
# cudagraph_mode and max_cudagraph_capture_size are keys of their own);
# max_seq_len_to_capture, max_num_partial_prefills: gone from vLLM 0.32) are only known when set explicitly.
RESOLVED_KEYS: dict[str, tuple[str, str]] = {
    "dtype": ("model_config", "dtype"),
    "max_model_len": ("model_config", "max_model_len"),
    "enforce_eager": ("model_config", "enforce_eager"),
    "disable_cascade_attn": ("model_config", "disable_cascade_attn"),
    "max_num_seqs": ("scheduler_config", "max_num_seqs"),
    "max_num_batched_tokens": ("scheduler_config", "max_num_batched_tokens"),
    "enable_chunked_prefill": ("scheduler_config", "enable_chunked_prefill"),
    "async_scheduling": ("scheduler_config", "async_scheduling"),
    "long_prefill_token_threshold": ("scheduler_config", "long_prefill_token_threshold"),
    "scheduling_policy": ("scheduler_config", "policy"),
    "stream_interval": ("scheduler_config", "stream_interval"),
    # not in VllmConfig: the CLI's own argument, which vLLM's `serve` defaults to the data-parallel size
    "api_server_count": ("cli", "api_server_count"),
    # vLLM CPU turns `uni` back into `mp` unless VLLM_ENABLE_V1_MULTIPROCESSING=0 (harness/engine_args.py)
    "distributed_executor_backend": ("parallel_config", "distributed_executor_backend"),
    "block_size": ("cache_config", "block_size"),
    "kv_cache_dtype": ("cache_config", "cache_dtype"),
    "gpu_memory_utilization": ("cache_config", "gpu_memory_utilization"),
    "load_format": ("load_config", "load_format"),
    "cudagraph_mode": ("compilation_config", "cudagraph_mode"),
    "max_cudagraph_capture_size": ("compilation_config", "max_cudagraph_capture_size"),
}
# Runs in `python -I`: the installed vLLM only, never a workspace overlay. argv[1] is the JSON of
# RESOLVED_KEYS, the rest is the server's argv. Logs go to stderr; the one result line to stdout.
_PROBE = f"""
import enum, json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ModuleNotFoundError:  # vLLM before the launchers package
    from vllm.entrypoints.openai.cli_args import make_arg_parser
keys = json.loads(sys.argv[1])
args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[2:])
config = AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
out = {{}}
for key, (section, name) in keys.items():
    if section == "cli":
        value = getattr(args, name, None) or config.parallel_config.data_parallel_size
    else:
        value = getattr(getattr(config, section, None), name, None)
    if isinstance(value, enum.Enum):   # a str-valued enum by value; CUDAGraphMode (tuple values) by name
        value = value.value if isinstance(value.value, str) else value.name
    if value is not None and not isinstance(value, (bool, int, float, str)):
        value = str(value).removeprefix("torch.")   # torch.float32 -> float32
    if value is not None:
        out[key] = value
print({_TAG!r} + json.dumps(out), flush=True)
"""


def _fits(key: str, value: object) -> bool:
    types = ENGINE_ARG_TYPES[key]
    return isinstance(value, bool) == (bool in types) and isinstance(value, types)


def effective_engine_args(model: Path, engine_args: Mapping[str, object], *, env: Mapping[str, str] | None = None,
                          python: str = sys.executable, timeout_s: float = 120.0) -> dict[str, object]:
    """The engine args in force when the server runs `model` with `engine_args` (the incumbent's serving config).

    Every allowlist key vLLM resolves (`RESOLVED_KEYS`) carries vLLM's value: an explicit key passes through
    vLLM, which may override it (vLLM CPU forces async_scheduling off); an explicit key it cannot resolve
    keeps its given value; a default it cannot resolve is absent. `env` is the spec's server env (allowlisted).
    Raises EngineArgRejected for a key off the allowlist, EngineDefaultsUnknown when vLLM cannot resolve.
    """
    argv_tail = engine_argv(engine_args)         # validates the keys and types first
    python = os.path.abspath(python) if os.sep in python else python   # the child runs in a temporary cwd
    model = Path(model).resolve()
    if not (model / "config.json").is_file():
        raise EngineDefaultsUnknown(f"model directory {model} has no config.json; check server.model in the spec "
                                    "(engine defaults unknown: fall back to the raw serving config)")
    with tempfile.TemporaryDirectory(prefix="ratchet-engine-defaults-") as home:
        run_env = {**SERVER_ENV, **check_env(env or {}), "HOME": home, "VLLM_CACHE_ROOT": str(Path(home) / "vllm")}
        run_env["PATH"] = f"{Path(python).parent}:{run_env['PATH']}"
        # The server's fixed flags (harness/server.py) too: they can move defaults.
        argv = [python, "-I", "-c", _PROBE, json.dumps(RESOLVED_KEYS), "--model", str(model),
                "--no-enable-prefix-caching", "--seed", "0", *argv_tail]
        stdout, stderr, code = _run(argv, env=run_env, cwd=home, timeout_s=timeout_s)
    lines = [line for line in stdout.splitlines() if line.startswith(_TAG)]
    if code != 0 or not lines:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        raise EngineDefaultsUnknown(f"vLLM ({python}) could not resolve the engine config for {model} with "
                                    f"{dict(engine_args)} (exit code {code}); fix the serving config or the "
                                    f"install, or go on with the raw serving config; last lines of stderr:\n{tail}")
    try:
        resolved = json.loads(lines[-1][len(_TAG):])
    except json.JSONDecodeError as exc:
        raise EngineDefaultsUnknown(f"vLLM's resolved engine config is not JSON ({exc}): {lines[-1][:300]}") from exc
    effective = dict(engine_args)
    effective.update({key: value for key, value in resolved.items() if key in RESOLVED_KEYS and _fits(key, value)})
    return dict(sorted(effective.items()))


def _run(argv: list[str], *, env: dict[str, str], cwd: str, timeout_s: float) -> tuple[str, str, int]:
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, text=True, start_new_session=True)
    except OSError as exc:
        raise EngineDefaultsUnknown(f"cannot run {argv[0]} to resolve vLLM's engine config ({exc}); pass the "
                                    "python of the environment vLLM is installed in") from exc
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise EngineDefaultsUnknown(f"vLLM's engine-config resolution did not finish in {timeout_s:g} s and was "
                                    "killed; raise timeout_s or check the host's load (defaults unknown)") from exc
    finally:
        if proc.poll() is None:   # timed out (or interrupted): kill its whole process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return stdout, stderr, proc.returncode
