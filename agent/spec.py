"""The campaign spec: one YAML file composing each room's own config model.

Relative paths in a spec are relative to the spec file. Unknown keys and bad values are rejected
with the field path (`benchmark.input_lens.1: Input should be greater than 0`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.config import BenchmarkConfig, ParityConfig, ServerConfig, StatsConfig

__all__ = ["CampaignSpec", "TargetConfig", "SandboxConfig", "SpecError", "load_spec"]

_STRICT = ConfigDict(extra="forbid", frozen=True)


class SpecError(Exception):
    """The spec file is missing, not YAML, or does not validate."""


class TargetConfig(BaseModel):
    model_config = _STRICT
    kind: Literal["vllm-installed", "vllm-source"] = "vllm-installed"
    package: str = "vllm"
    source: Path | None = Field(default=None, description="vllm-source: a checkout holding vllm/")
    workspace: Path | None = Field(default=None, description="default: .ratchet/workspaces/<name>")


class SandboxConfig(BaseModel):
    model_config = _STRICT
    backend: Literal["local", "docker"] = "local"
    image: str = "ratchet-sandbox:cpu"
    gpus: int = 0
    cpus: float | None = None
    memory_gb: float | None = None


class CampaignSpec(BaseModel):
    model_config = _STRICT
    schema_version: Literal[1]
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    description: str = ""
    hardware: Literal["cpu", "gpu"] = "cpu"
    target: TargetConfig = TargetConfig()
    server: ServerConfig
    benchmark: BenchmarkConfig
    parity: ParityConfig
    stats: StatsConfig = StatsConfig()
    sandbox: SandboxConfig = SandboxConfig()

    def workspace_dir(self, cwd: Path) -> Path:
        return (self.target.workspace or cwd / ".ratchet" / "workspaces" / self.name).resolve()


def _resolve_paths(data: dict[str, object], base: Path) -> None:
    """Make the spec's path fields absolute, relative to the spec file's folder."""
    targets = {("server", "model"), ("parity", "prompts"), ("parity", "visible_prompts"),
               ("target", "source"), ("target", "workspace")}
    for section, key in targets:
        block = data.get(section)
        if isinstance(block, dict) and isinstance(block.get(key), str):
            path = Path(block[key]).expanduser()
            block[key] = str(path if path.is_absolute() else (base / path).resolve())


def _format_error(path: Path, exc: ValidationError) -> str:
    lines = [f"{path}: {exc.error_count()} problem(s):"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = "unknown key (check spelling; see experiments/README.md)" if err["type"] == "extra_forbidden" \
            else err["msg"]
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def load_spec(path: Path) -> CampaignSpec:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise SpecError(f"spec {path} not found; specs live in experiments/*.yaml") from exc
    except yaml.YAMLError as exc:
        detail = re.sub(r"\s+", " ", str(exc))
        raise SpecError(f"{path} is not valid YAML: {detail}") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a spec is a YAML mapping, got {type(data).__name__}")
    _resolve_paths(data, path.resolve().parent)
    try:
        return CampaignSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_error(path, exc)) from None
