"""The spec of a kernel campaign (`target.kind: kernel`): one kernel file, shapes, checks, timing, a search
over the kernel's tunables. Strict like agent/spec.py: unknown keys and bad values are rejected with their
field path; relative paths are relative to the spec file.

    schema_version: 1
    name: gemma4-e2b-attention
    target: {kind: kernel, source: kernels/gemma4_attention, module: attention.py, entry: attention}
    shapes: [{name: decode-sliding, batch: 64, q_len: 1, kv_len: 4096, head_dim: 256, sliding_window: 512}]
    proposer: {kind: search, search: {strategy: random, space: {DECODE_D256_SPLITS: [1, 2, 4, 8]}}}
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

import policies
from agent.spec import (
    BudgetConfig,
    LLMSettings,
    SearchConfig,
    SpecError,
    format_spec_error,
    read_spec_file,
    resolve_patch_files,
)
from harness.config import StatsConfig
from harness.kernel.config import CorrectnessConfig, Interface, RooflineConfig, ShapeConfig, TimingConfig

__all__ = ["KernelTarget", "KernelProposerConfig", "KernelSpec", "is_kernel_spec", "load_kernel_spec",
           "KERNEL_POLICY", "VLLM_KERNEL_POLICY"]

_STRICT = ConfigDict(extra="forbid", frozen=True)
KERNEL_POLICY = Path(policies.__file__).resolve().parent / "kernel.yaml"
VLLM_KERNEL_POLICY = Path(policies.__file__).resolve().parent / "vllm-kernel.yaml"


class KernelTarget(BaseModel):
    model_config = _STRICT
    kind: Literal["kernel"]
    interface: Interface = Field(
        default="contiguous", description="how the harness calls the entry (harness/kernel/interfaces.py): "
        "ratchet's contiguous-KV contract, or vLLM's unified attention as its TRITON_ATTN backend calls it")
    source: Path | None = Field(
        default=None, description="the kernel folder, copied whole into the campaign's git workspace; for "
                                  "vllm-unified-attention the vllm package folder (default: the installed vLLM)")
    module: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_./-]*\.py$", description="the kernel file inside source")
    entry: str = Field(default="attention", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    prelude: Path | None = Field(
        default=None, description="a patch to the kernel file applied once before the search, e.g. one that names "
        "vLLM's launch parameters as `NAME = int` tunables at values that keep its behaviour: gated, checked and "
        "timed against the stock file like a candidate, kept only if correct on every shape and no shape "
        "regresses; the final comparison is always against the stock file")
    workspace: Path | None = Field(default=None, description="default: <workspaces>/<campaign-id>")

    @model_validator(mode="after")
    def _source(self) -> KernelTarget:
        if self.source is None and self.interface == "contiguous":
            raise ValueError("source: the kernel folder is required (only vllm-unified-attention defaults to the "
                             "installed vLLM)")
        return self

    @property
    def source_dir(self) -> Path:
        """The folder copied into the workspace: `source`, or the installed vllm package."""
        if self.source is not None:
            return self.source
        from sandbox.workspace import installed_package_dir

        return installed_package_dir("vllm")

    @property
    def package(self) -> str:
        return self.source.name if self.source is not None else "vllm"

    @property
    def kernel_file(self) -> str:
        """The kernel file relative to the workspace root (the path patches and the gate use)."""
        return f"{self.package}/{self.module}"


class KernelProposerConfig(BaseModel):
    """search: the kernel's `NAME = int` tunables; llm: a coding agent editing the kernel file, with
    check_kernel (the harness's checks and a timing of its patch) before it proposes; patches: given patch files,
    in order (agent/proposers/patch_files.py)."""

    model_config = _STRICT
    kind: Literal["search", "llm", "patches"] = "search"
    search: SearchConfig = SearchConfig()
    llm: LLMSettings = LLMSettings()
    patches: list[Path] = Field(default_factory=list, description=(
        "kind patches: patch files of the kernel proposed in order, one per iteration; relative to the spec"))

    @model_validator(mode="after")
    def _integer_tunables(self) -> KernelProposerConfig:
        if self.kind == "patches" and not self.patches:
            raise ValueError("kind: patches needs proposer.patches, a list of patch files")
        for name, values in self.search.space.items():
            if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
                raise ValueError(f"tunable {name!r}: names are module constants in CAPITALS")
            if not values or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
                raise ValueError(f"tunable {name}: give a non-empty list of integers")
        return self


class KernelSpec(BaseModel):
    model_config = _STRICT
    schema_version: Literal[1]
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    description: str = ""
    hardware: Literal["cpu", "gpu"] = "gpu"
    target: KernelTarget
    device: Literal["cuda", "cpu"] = "cuda"
    interpret: bool = Field(default=False, description="run Triton kernels in its interpreter (CPU only)")
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    shapes: list[ShapeConfig] = Field(min_length=1)
    correctness: CorrectnessConfig = CorrectnessConfig()
    timing: TimingConfig = TimingConfig()
    roofline: RooflineConfig | None = RooflineConfig()
    stats: StatsConfig = StatsConfig()
    policy: Path | None = Field(default=None, description="policy file, relative to the spec file (default: "
                                "policies/kernel.yaml, or policies/vllm-kernel.yaml for vLLM's kernel)")
    proposer: KernelProposerConfig = KernelProposerConfig()
    budget: BudgetConfig = BudgetConfig()
    runner_timeout_s: float = Field(default=600.0, gt=0, description="one evaluation (runner process) at most")
    serving: Path | None = Field(
        default=None, description="a serving spec (experiments/*.yaml) for the end-to-end stage of a campaign on "
        "vLLM's kernel: when the kernel stage's final comparison accepts its best, stock vs best are served from "
        "the same vLLM tree with that spec's server, grid, parity and statistics (engine args as it sets them, "
        "for both), and the campaign's verdict rests on that A/B; relative to this spec file")
    final_comparison: bool = Field(default=True, description="baseline vs best once more at the end")

    @model_validator(mode="after")
    def _consistent(self) -> KernelSpec:
        names = [s.name for s in self.shapes]
        if len(set(names)) != len(names):
            raise ValueError(f"shape names must be unique, got {names}")
        if self.interpret and self.device != "cpu":
            raise ValueError("interpret: true runs Triton's interpreter on CPU tensors; set device: cpu")
        if self.target.interface == "vllm-unified-attention" and self.target.package != "vllm":
            raise ValueError("target.source: vllm-unified-attention needs the vllm package folder (…/vllm)")
        mixed = [s.name for s in self.shapes if s.decodes]
        if mixed and self.target.interface == "contiguous":
            raise ValueError(f"shapes {', '.join(mixed)}: a mixed batch (decodes) is one call over sequences of "
                             "different lengths; the contiguous interface has one length per call")
        if self.serving is not None and self.target.interface != "vllm-unified-attention":
            raise ValueError("serving: the end-to-end stage serves a vLLM tree; it needs target.interface: "
                             "vllm-unified-attention")
        return self

    @property
    def policy_file(self) -> Path:
        if self.policy is not None:
            return self.policy
        return VLLM_KERNEL_POLICY if self.target.interface == "vllm-unified-attention" else KERNEL_POLICY


def is_kernel_spec(path: Path) -> bool:
    """Whether the file asks for a kernel campaign (`target.kind: kernel`); dispatchers use this."""
    target = read_spec_file(Path(path)).get("target")
    return isinstance(target, dict) and target.get("kind") == "kernel"


def load_kernel_spec(path: Path) -> KernelSpec:
    path = Path(path)
    data = read_spec_file(path)
    target = data.get("target")
    if not (isinstance(target, dict) and target.get("kind") == "kernel"):
        raise SpecError(f"{path}: not a kernel spec (target.kind is not 'kernel'); run it with `ratchet run`")
    base = path.resolve().parent
    resolve_patch_files(data, base)
    for block, key in ((data, "policy"), (data, "serving"), (target, "source"), (target, "workspace"),
                       (target, "prelude")):
        if isinstance(block.get(key), str):
            p = Path(str(block[key])).expanduser()
            block[key] = str(p if p.is_absolute() else (base / p).resolve())
    try:
        return KernelSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_spec_error(path, exc, docs="experiments/README.md, kernel campaigns")) from None
