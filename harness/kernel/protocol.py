"""The request a campaign hands the runner process (JSON file), and where the runner's answer goes.

The result is plain JSON (see README.md for its keys); the campaign reads it as data, never as code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.kernel.config import CorrectnessConfig, Interface, RooflineConfig, ShapeConfig, TimingConfig

__all__ = ["EvalRequest"]


class EvalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    builds: dict[str, Path] = Field(min_length=1, description="tag -> tree; timed in this order, then reversed")
    module: str = Field(description="the kernel file, relative to each tree")
    entry: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    interface: Interface = Field(default="contiguous", description="how the entry is called (interfaces.py)")
    shapes: list[ShapeConfig] = Field(min_length=1)
    correctness: CorrectnessConfig = CorrectnessConfig()
    timing: TimingConfig = TimingConfig()
    roofline: RooflineConfig | None = None
    device: Literal["cuda", "cpu"] = "cuda"
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    seed: int = Field(ge=0, description="draws every check's input seed; new for each evaluation")
