"""The campaign spec: one YAML file composing each room's own config model.

Relative paths in a spec are relative to the spec file. Unknown keys and bad values are rejected
with the field path (`benchmark.input_lens.1: Input should be greater than 0`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

import policies
from harness.config import BenchmarkConfig, ParityConfig, ServerConfig, StatsConfig
from harness.engine_args import check_engine_args
from harness.errors import EngineArgRejected

__all__ = ["CampaignSpec", "TargetConfig", "SandboxConfig", "SearchConfig", "ProposerConfig", "BudgetConfig",
           "LLMSettings", "SpecError", "load_spec", "read_spec_file", "format_spec_error", "ExecutorConfig",
           "RayConfig"]

_STRICT = ConfigDict(extra="forbid", frozen=True)
DEFAULT_POLICY = Path(policies.__file__).resolve().parent / "default.yaml"


class SpecError(Exception):
    """The spec file is missing, not YAML, or does not validate."""


class TargetConfig(BaseModel):
    model_config = _STRICT
    kind: Literal["vllm-installed", "vllm-source", "vllm-image"] = Field(default="vllm-installed", description=(
        "what the workspace copies: vllm-installed, this interpreter's vllm package; vllm-source, target.source's "
        "vllm/; vllm-image, the vllm package of the Docker image the servers run in (sandbox.image; needs "
        "sandbox.backend: docker), so the overlay shadows the image's own vLLM"))
    package: str = "vllm"
    source: Path | None = Field(default=None, description="vllm-source: a checkout holding vllm/")
    workspace: Path | None = Field(default=None, description="default: .ratchet/workspaces/<name>")


class SandboxConfig(BaseModel):
    model_config = _STRICT
    backend: Literal["auto", "docker", "bwrap", "unisolated", "local"] = Field(default="auto", description=(
        "auto: docker where dockerd answers and the sandbox image is built, else bwrap; a host with neither "
        "is refused. unisolated: candidate code runs as this user (only by name; the llm proposer refuses "
        "it). local: the name used before auto, read from older specs and logs (local_isolation says which)"))
    local_isolation: Literal["none", "netns"] = Field(
        default="none", description="only with backend: local (older specs): netns = bwrap, none = unisolated")
    image: str = "ratchet-sandbox:cpu"
    gpus: int = 0
    cpus: float | None = None
    memory_gb: float | None = None


class SearchConfig(BaseModel):
    """The `search` proposer: engine-arg points of the serving config, expressed as patches."""

    model_config = _STRICT
    strategy: Literal["random", "ordered", "grid"] = Field(
        default="random", description="random: unseen points near the incumbent first; ordered: the same moves in "
        "the order the space is written (the author's priority); grid: the space in order")
    space: dict[str, list[bool | int | float | str]] = Field(
        default_factory=dict, description="engine arg -> candidate values (keys from the harness allowlist)")
    seed: int = 0


class LLMSettings(BaseModel):
    """Where the `llm` proposer's OpenAI-compatible endpoint is; see agent/proposers/README.md. Every other key is
    one of `LLMConfig`'s (agent/proposers/llm_config.py), checked when the spec loads like every other section
    (a misspelt key would otherwise surface only once `--proposer llm` runs)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    base_url: str | None = None
    model: str | None = None

    @model_validator(mode="after")
    def _known_to_the_proposer(self) -> LLMSettings:
        from agent.proposers.llm_config import LLMConfig

        settings = self.model_dump(exclude_none=True)
        # `model` may come from --llm-model at run time: a stand-in lets the rest be checked now
        LLMConfig.model_validate({"model": "-", **settings})
        return self


class ProposerConfig(BaseModel):
    model_config = _STRICT
    kind: Literal["search", "llm", "patches"] = "search"
    search: SearchConfig = SearchConfig()
    llm: LLMSettings = LLMSettings()
    patches: list[Path] = Field(default_factory=list, description=(
        "kind patches: patch files proposed in order, one per iteration (a change written elsewhere, e.g. a "
        "vendor's, put through the same gate and verdict); relative to the spec file"))

    @model_validator(mode="after")
    def _patch_files(self) -> ProposerConfig:
        if self.kind == "patches" and not self.patches:
            raise ValueError("kind: patches needs proposer.patches, a list of patch files")
        return self


class BudgetConfig(BaseModel):
    """The campaign stops cleanly before any of these would be overrun."""

    model_config = _STRICT
    max_iterations: int = Field(default=4, ge=0)
    wall_seconds: float = Field(default=3600.0, gt=0)
    llm_tokens: int = Field(default=200_000, ge=0)
    llm_usd: float = Field(default=5.0, ge=0)
    gpu_minutes: float = Field(default=0.0, ge=0, description="GPU-minutes of evaluations; 0: not metered")
    trials: int = Field(default=6, ge=0, description=(
        "try_patch runs the LLM agent may make over the campaign (each starts an isolated incumbent and "
        "candidate: visible-prompt parity and a short measurement, a hint, never a verdict); 0: none"))


class RayConfig(BaseModel):
    """Where and how each candidate evaluation runs as a Ray task."""

    model_config = _STRICT
    address: str | None = Field(
        default=None, description="an existing cluster (e.g. auto, 10.0.0.1:6379); none: a local Ray for this run")
    num_cpus: float = Field(default=1.0, ge=0, description="CPU cores one evaluation (two servers + client) asks for")
    num_gpus: float = Field(default=0.0, ge=0, description="GPUs one evaluation asks for (1 on a GPU cluster)")
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources per evaluation")
    max_retries: int = Field(default=1, ge=0, description="resubmissions after a lost worker or node")


class ExecutorConfig(BaseModel):
    """Where candidate evaluations run. The coordinator (this process) keeps the only audit writer,
    the only git branch and the budget; evaluations return results as data."""

    model_config = _STRICT
    kind: Literal["local", "ray"] = "local"
    slots: int = Field(default=1, ge=1, le=64, description=(
        "candidates per round. ray: evaluations in flight at once, each with its own incumbent server (one GPU "
        "each). local: the round's candidates are screened together on this host against one incumbent server, "
        "every server up at once and every run interleaved (one start-up and one incumbent serve them all); at "
        "most 6, since each candidate adds a server (and a parity server) to one machine"))
    ray: RayConfig = RayConfig()

    @model_validator(mode="after")
    def _local_slots_fit_one_host(self) -> ExecutorConfig:
        if self.kind == "local" and self.slots > 6:
            raise ValueError(f"slots: {self.slots} candidates screened together on one host; at most 6 (each is a "
                             "server of its own beside the incumbent's): use kind: ray for more")
        return self


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
    policy: Path = Field(default=DEFAULT_POLICY, description="policy file; relative to the spec file")
    proposer: ProposerConfig = ProposerConfig()
    budget: BudgetConfig = BudgetConfig()
    executor: ExecutorConfig = ExecutorConfig()
    final_comparison: bool = Field(default=True, description="measure best vs baseline once more at the end")
    profile_baseline: bool | None = Field(
        default=None, description="profile the incumbent (the baseline, then each accepted change) at the grid's "
        "largest cell for the proposer; default: when the proposer reads profiles (llm)")

    @model_validator(mode="after")
    def _parity_needs_real_weights(self) -> CampaignSpec:
        try:
            check_engine_args(self.server.engine_args)
        except EngineArgRejected as exc:
            raise ValueError(f"server.engine_args: {exc}") from None
        # a misspelt key or a value of the wrong type fails here, not as one invalid iteration per point
        for key, values in self.proposer.search.space.items():
            for value in values:
                try:
                    check_engine_args({key: value})
                except EngineArgRejected as exc:
                    raise ValueError(f"proposer.search.space.{key}: {exc}") from None
        if self.target.kind == "vllm-image" and self.sandbox.backend != "docker":
            raise ValueError(f"target.kind: vllm-image copies vLLM out of sandbox.image ({self.sandbox.image}), the "
                             "image the servers run in: set sandbox.backend: docker (this spec's is "
                             f"{self.sandbox.backend}), or use target.kind: vllm-installed for this host's vLLM")
        if self.target.kind == "vllm-image" and self.target.source is not None:
            raise ValueError("target.source is for target.kind: vllm-source; vllm-image copies the image's package")
        if self.hardware == "gpu" and self.server.start_together \
                and "kv_cache_memory_bytes" not in self.server.engine_args:
            raise ValueError("server.start_together on a GPU: vLLM sizes its KV cache by profiling free GPU memory, "
                             "which a server starting beside it disturbs (or fails: 'Error in memory profiling'); "
                             "set server.engine_args.kv_cache_memory_bytes (the same for every build; e.g. "
                             "17179869184 for 16 GiB), or server.start_together: false")
        if self.server.engine_args.get("load_format") == "dummy" and self.parity.model is None:
            raise ValueError("server.engine_args.load_format is dummy: every logprob is equal, so greedy tokens "
                             "prove nothing; set parity.model to a real checkpoint (e.g. models/gemma4-tiny)")
        return self

    def target_source(self) -> Path | None:
        """The package folder to copy into a workspace; None: the installed package. A vllm-image target's
        package is inside the image: agent/target.py workspace_source() copies it out."""
        if self.target.kind == "vllm-image":
            raise SpecError("target.kind: vllm-image has no folder on this host; create the workspace through "
                            "agent.target.workspace_source(spec)")
        return self.target.source / self.target.package if self.target.source else None

    def workspace_dir(self, cwd: Path) -> Path:
        return (self.target.workspace or cwd / ".ratchet" / "workspaces" / self.name).resolve()


def _resolve_paths(data: dict[str, object], base: Path) -> None:
    """Make the spec's path fields absolute, relative to the spec file's folder."""
    if "policy" not in data:
        data["policy"] = str(DEFAULT_POLICY)
    elif isinstance(data["policy"], str):
        policy = Path(data["policy"]).expanduser()
        data["policy"] = str(policy if policy.is_absolute() else (base / policy).resolve())
    targets = {("server", "model"), ("parity", "prompts"), ("parity", "visible_prompts"), ("parity", "model"),
               ("target", "source"), ("target", "workspace")}
    for section, key in targets:
        block = data.get(section)
        if isinstance(block, dict) and isinstance(block.get(key), str):
            path = Path(block[key]).expanduser()
            block[key] = str(path if path.is_absolute() else (base / path).resolve())
    resolve_patch_files(data, base)


def resolve_patch_files(data: dict[str, object], base: Path) -> None:
    """proposer.patches, relative to the spec file's folder (serving and kernel specs alike)."""
    proposer = data.get("proposer")
    if isinstance(proposer, dict) and isinstance(proposer.get("patches"), list):
        proposer["patches"] = [str(p if (p := Path(str(x)).expanduser()).is_absolute() else (base / p).resolve())
                               for x in proposer["patches"]]


def format_spec_error(path: Path, exc: ValidationError, *, docs: str = "experiments/README.md") -> str:
    """Every problem on its own line, with its field path; unknown keys point at the spec reference."""
    lines = [f"{path}: {exc.error_count()} problem(s):"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = f"unknown key (check spelling; see {docs})" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def read_spec_file(path: Path) -> dict[str, object]:
    """The spec's YAML mapping, or a SpecError saying what is wrong with the file."""
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise SpecError(f"spec {path} not found; specs live in experiments/*.yaml") from exc
    except yaml.YAMLError as exc:
        detail = re.sub(r"\s+", " ", str(exc))
        raise SpecError(f"{path} is not valid YAML: {detail}") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a spec is a YAML mapping, got {type(data).__name__}")
    return data


def load_spec(path: Path) -> CampaignSpec:
    path = Path(path)
    data = read_spec_file(path)
    target = data.get("target")
    if isinstance(target, dict) and target.get("kind") == "kernel":   # else: a list of unknown keys, no way out
        raise SpecError(f"{path}: a kernel spec (target.kind: kernel): this command measures serving specs; "
                        "run it with `ratchet kernel SPEC` (or `ratchet run SPEC`)")
    _resolve_paths(data, path.resolve().parent)
    try:
        return CampaignSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_spec_error(path, exc)) from None
