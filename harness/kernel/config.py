"""The kernel harness's configuration models (the YAML/JSON boundary): shapes, checks, timing, roofline.

A kernel spec composes them (agent/kernel_spec.py); the runner receives them in its request file.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["ShapeConfig", "CorrectnessConfig", "TimingConfig", "RooflineConfig", "Interface", "INTERFACES"]

_STRICT = ConfigDict(extra="forbid", frozen=True)
PositiveInt = Annotated[int, Field(gt=0)]
# How the harness calls a kernel (harness/kernel/interfaces.py): ratchet's contiguous-KV contract, or vLLM's
# unified attention as its TRITON_ATTN backend calls it.
Interface = Literal["contiguous", "vllm-unified-attention"]
INTERFACES: tuple[str, ...] = ("contiguous", "vllm-unified-attention")


class ShapeConfig(BaseModel):
    """One attention call: [batch, q_len, q heads, head_dim] queries over [batch, kv_len, kv heads, head_dim]
    keys and values. q_len 1 is decode; q_len == kv_len is prefill (query i at position kv_len - q_len + i).
    With `decodes`, a mixed batch as vLLM schedules one: the `batch` sequences of q_len queries (a prefill chunk)
    and, after them in the same call, `decodes` sequences of one query over `decode_kv_len` keys each."""

    model_config = _STRICT
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    batch: PositiveInt
    q_len: PositiveInt
    kv_len: PositiveInt
    num_q_heads: PositiveInt = 8
    num_kv_heads: PositiveInt = 1
    head_dim: PositiveInt = 256
    sliding_window: PositiveInt | None = None
    softcap: Annotated[float, Field(gt=0)] | None = None
    block_size: Annotated[int, Field(ge=16, multiple_of=16)] = Field(
        default=16, description="tokens per KV-cache block for paged interfaces (vLLM's default, 16); "
                                "contiguous kernels ignore it")
    decodes: Annotated[int, Field(ge=0)] = Field(
        default=0, description="decode sequences (one query each) in the same call after the batch's prefill "
                               "queries: a mixed batch (paged interfaces only)")
    decode_kv_len: PositiveInt | None = Field(default=None, description="keys of each of those (default kv_len)")

    @model_validator(mode="after")
    def _consistent(self) -> ShapeConfig:
        if self.q_len > self.kv_len:
            raise ValueError(f"q_len {self.q_len} exceeds kv_len {self.kv_len}")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError("num_q_heads must be a multiple of num_kv_heads (GQA)")
        if self.decodes and self.q_len == 1:
            raise ValueError("decodes: a mixed batch is a prefill chunk (q_len > 1) beside decodes; a decode-only "
                             "batch is batch + decodes sequences of q_len 1")
        if self.decode_kv_len is not None and not self.decodes:
            raise ValueError("decode_kv_len without decodes")
        return self

    @property
    def mode(self) -> Literal["decode", "prefill", "mixed"]:
        return "mixed" if self.decodes else "decode" if self.q_len == 1 else "prefill"

    @property
    def groups(self) -> list[tuple[int, int, int]]:
        """(sequences, queries each, keys each) of each kind of sequence in the call, in call order."""
        chunk = [(self.batch, self.q_len, self.kv_len)]
        return chunk + [(self.decodes, 1, self.decode_kv_len or self.kv_len)] if self.decodes else chunk

    @property
    def num_seqs(self) -> int:
        return self.batch + self.decodes

    @property
    def tokens(self) -> int:
        """Queries in the call (rows of the flattened q)."""
        return sum(n * q for n, q, _ in self.groups)

    @property
    def max_kv_len(self) -> int:
        return max(k for _, _, k in self.groups)

    @property
    def scale(self) -> float:
        # 1/sqrt(d) keeps random-input softmaxes spread over many keys, so a wrong key range shows in the error
        return 1.0 / math.sqrt(self.head_dim)


class CorrectnessConfig(BaseModel):
    """Tolerances of the output against a float64 (or float32) reference computed from the same inputs."""

    model_config = _STRICT
    rel_l2: Annotated[float, Field(gt=0, lt=1)] = Field(
        default=1e-2, description="max ||out - ref|| / ||ref|| (bf16 operands land between 1e-3 and 1e-2)")
    max_rel: Annotated[float, Field(gt=0, lt=1)] = Field(
        default=5e-2, description="max |out - ref| / max |ref|, element-wise")
    reference_dtype: Literal["float64", "float32"] = "float64"


class TimingConfig(BaseModel):
    """Each build is timed in rounds; rounds alternate the order of the builds, so drift hits both sides."""

    model_config = _STRICT
    rounds: Annotated[int, Field(ge=2)] = 20
    calls_per_round: PositiveInt = 10
    warmup_calls: Annotated[int, Field(ge=1)] = 5
    flush_l2: bool = Field(default=True, description="overwrite a buffer of twice the L2 before every timed call")
    hide_launch_overhead: bool = Field(
        default=True, description="queue a spin kernel before each start event: time device work, not host launches")
    cuda_graph: Literal["never", "decode", "always"] = Field(
        default="never", description="time replays of a CUDA graph of the call (decode: q_len-1 shapes only), as "
                                     "vLLM runs decode steps; the checks still call the kernel directly")


class RooflineConfig(BaseModel):
    """The ceilings each figure is compared against, measured on the same GPU in the same run."""

    model_config = _STRICT
    copy_bytes: PositiveInt = Field(default=2 << 30, description="bytes of the device-to-device copy (read once)")
    matmul_n: PositiveInt = Field(default=8192, description="n of the n x n x n bf16 matrix product")
    repeats: Annotated[int, Field(ge=3)] = 20
