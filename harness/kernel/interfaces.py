"""How the harness calls a kernel: its calling convention (`target.interface` of a kernel spec).

The harness owns every tensor. It draws contiguous q, k, v ([batch, len, heads, head_dim]) and an output of
q's shape, and the float64 reference is computed from those; an interface only lays them out the way its
kernel reads them and calls it. `bind` returns the call and every tensor the call may read, which the checks
compare before and after (a kernel must not write its inputs: a later call would see other data).

- `contiguous`: ratchet's own kernels, `entry(q, k, v, out, *, scale, sliding_window, softcap)`.
- `vllm-unified-attention`: vLLM's Triton unified attention (`unified_attention` in
  vllm/v1/attention/ops/triton_unified_attention.py), called as vLLM's TRITON_ATTN backend calls it for
  Gemma 4 (vllm/v1/attention/backends/triton_attn.py): queries flattened to [tokens, heads, head_dim] with
  `cu_seqlens_q`; K and V in one paged cache [blocks, block_size, kv_heads, 2 * head_dim] (the NHD layout:
  a token's K and V side by side) read through a block table whose blocks are shuffled (a kernel that
  ignores the table reads the wrong keys); window as (W - 1, 0); per-sequence descales of ones; and the
  backend's own 3D-kernel choice: sequences up to MIN_LAUNCH_GRID_SIZE_2D // kv_heads take the split
  ("3D") path with NUM_PAR_SOFTMAX_SEGMENTS segments, both constants read from the build's own backend file.
  The decode CUDA graph sizes vLLM captures by default contain that threshold (128 for one kv head), so
  vLLM's graph-mode adjustment of it changes nothing on these shapes. A mixed batch (a shape's `decodes`) is
  one call over sequences of different query and key counts (cu_seqlens_q, seqused_k), as vLLM schedules a
  prefill chunk beside running decodes.
"""

from __future__ import annotations

import ast
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.kernel.config import INTERFACES, Interface, ShapeConfig

__all__ = ["Interface", "BoundCall", "bind", "VllmBackendConstants", "read_backend_constants", "INTERFACES",
           "BACKEND_FILE"]

BACKEND_FILE = "vllm/v1/attention/backends/triton_attn.py"   # relative to the tree holding vllm/


@dataclass(frozen=True)
class BoundCall:
    """One prepared call: `run()` writes `out` (the harness's [batch, q_len, heads, head_dim] tensor, or a view
    sharing its storage); `inputs` are every tensor the call reads, by name."""

    run: Callable[[], object]
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class VllmBackendConstants:
    min_launch_grid_size_2d: int = 128
    num_par_softmax_segments: int = 16

    def seq_threshold_3d(self, num_kv_heads: int) -> int:
        return self.min_launch_grid_size_2d // num_kv_heads


def read_backend_constants(tree: Path) -> VllmBackendConstants:
    """MIN_LAUNCH_GRID_SIZE_2D and NUM_PAR_SOFTMAX_SEGMENTS as the build's backend file sets them (parsed, not
    imported: importing the backend pulls in vLLM's whole config machinery)."""
    path = tree / BACKEND_FILE
    wanted = {"MIN_LAUNCH_GRID_SIZE_2D": "min_launch_grid_size_2d",
              "NUM_PAR_SOFTMAX_SEGMENTS": "num_par_softmax_segments"}
    found: dict[str, int] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in wanted and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
                found[wanted[name]] = node.value.value
    missing = [k for k, v in wanted.items() if v not in found]
    if missing:
        raise ValueError(f"{path} sets no integer {', '.join(missing)}: this vLLM's backend is not the one the "
                         "vllm-unified-attention interface knows")
    return VllmBackendConstants(**found)


def _bind_contiguous(fn: Callable[..., Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                     shape: ShapeConfig) -> BoundCall:
    if shape.decodes:
        raise ValueError(f"shape {shape.name}: a mixed batch (decodes) needs a paged interface; the contiguous "
                         "one takes sequences of one length")

    def run() -> None:
        fn(q, k, v, out, scale=shape.scale, sliding_window=shape.sliding_window, softcap=shape.softcap)

    return BoundCall(run=run, inputs={"q": q, "k": k, "v": v})


def paged_cache(k: torch.Tensor, v: torch.Tensor, *, block_size: int, generator: torch.Generator
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_cache [blocks, block_size, kv_heads, 2 * d], block_table [batch, blocks per sequence] int32): each
    sequence's keys and values copied into blocks at shuffled places, with spare blocks that nothing uses."""
    batch, kv_len, kv_heads, d = k.shape
    per_seq = math.ceil(kv_len / block_size)
    total = batch * per_seq + 7
    cache = torch.zeros(total, block_size, kv_heads, 2 * d, dtype=k.dtype, device=k.device)
    order = torch.randperm(total, generator=generator, device="cpu")[: batch * per_seq].to(k.device)
    table = order.view(batch, per_seq).to(torch.int32)
    padded = per_seq * block_size
    for kv, half in ((k, slice(0, d)), (v, slice(d, 2 * d))):
        full = torch.zeros(batch, padded, kv_heads, d, dtype=k.dtype, device=k.device)
        full[:, :kv_len] = kv
        cache[order, :, :, half] = full.view(batch * per_seq, block_size, kv_heads, d)
    return cache, table


def _bind_vllm(fn: Callable[..., Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
               shape: ShapeConfig, *, backend: VllmBackendConstants, seed: int) -> BoundCall:
    heads, d, device = shape.num_q_heads, shape.head_dim, q.device
    generator = torch.Generator(device="cpu").manual_seed(seed)
    cache, table = paged_cache(k, v, block_size=shape.block_size, generator=generator)
    key_cache, value_cache = cache[..., :d], cache[..., d:]
    q_flat, out_flat = q.view(shape.tokens, heads, d), out.view(shape.tokens, heads, d)
    q_lens = [q_len for n, q_len, _ in shape.groups for _ in range(n)]
    cu_seqlens_q = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=device)
    seqused_k = torch.tensor([kv for n, _, kv in shape.groups for _ in range(n)], dtype=torch.int32, device=device)
    q_len, kv_len = max(q_lens), shape.max_kv_len
    descale = torch.ones(shape.num_seqs, shape.num_kv_heads, dtype=torch.float32, device=device)
    threshold = backend.seq_threshold_3d(shape.num_kv_heads)
    segments = backend.num_par_softmax_segments
    padded = 1 << (d - 1).bit_length()
    segm_output = torch.empty(threshold, heads, segments, padded, dtype=torch.float32, device=device)
    segm_max = torch.empty(threshold, heads, segments, dtype=torch.float32, device=device)
    segm_expsum = torch.empty(threshold, heads, segments, dtype=torch.float32, device=device)
    window = (shape.sliding_window - 1, 0) if shape.sliding_window else (-1, -1)

    def run() -> None:
        fn(q=q_flat, k=key_cache, v=value_cache, out=out_flat, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=q_len,
           seqused_k=seqused_k, max_seqlen_k=kv_len, softmax_scale=shape.scale, causal=True,
           window_size=window, block_table=table, softcap=shape.softcap or 0, q_descale=None,
           k_descale=descale, v_descale=descale, seq_threshold_3D=threshold, num_par_softmax_segments=segments,
           softmax_segm_output=segm_output, softmax_segm_max=segm_max, softmax_segm_expsum=segm_expsum)

    return BoundCall(run=run, inputs={"q": q, "kv_cache": cache, "block_table": table,
                                      "cu_seqlens_q": cu_seqlens_q, "seqused_k": seqused_k})


def bind(interface: Interface, fn: Callable[..., Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
         out: torch.Tensor, shape: ShapeConfig, *, seed: int = 0,
         backend: VllmBackendConstants | None = None) -> BoundCall:
    """The call of `fn` on these tensors in `interface`'s convention. `seed` shuffles a paged cache's blocks;
    `backend`: the build's vLLM backend constants (vllm-unified-attention)."""
    if interface == "contiguous":
        return _bind_contiguous(fn, q, k, v, out, shape)
    if interface == "vllm-unified-attention":
        return _bind_vllm(fn, q, k, v, out, shape, backend=backend or VllmBackendConstants(), seed=seed)
    raise ValueError(f"unknown kernel interface {interface!r}; one of {', '.join(INTERFACES)}")
