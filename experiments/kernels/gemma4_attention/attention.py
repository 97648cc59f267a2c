"""Gemma 4 attention for one layer, in Triton: the target tree of a ratchet kernel campaign.

Entry point (the harness calls nothing else):

    attention(q, k, v, out, *, scale, sliding_window=None, softcap=None) -> None

- q, out: [batch, q_len, num_q_heads, head_dim]; k, v: [batch, kv_len, num_kv_heads, head_dim]; the last dim
  contiguous, any dtype Triton's dot takes (bf16 in the campaigns). `out` is written, nothing else is.
- Query i of a sequence sits at absolute position kv_len - q_len + i (prefill: q_len == kv_len; decode: q_len == 1),
  and sees key j iff j <= its position and, with a sliding window W, position - j < W (the W most recent keys,
  itself included; vLLM's convention). `softcap`: scores become softcap * tanh(scores / softcap).
- GQA: num_q_heads is a multiple of num_kv_heads (Gemma 4 E2B: 8 q heads on 1 kv head).

What it is not: vLLM's paged-KV kernel. The KV here is one contiguous tensor per layer (no block table, no
varlen batch), which is enough to search the block shapes and launch parameters that decide the speed of the
inner loops; porting a winner to the paged kernel is a separate step. Written for ratchet from the flash-attention
recipe (online softmax; split-KV "flash decoding" for short batches).

The names between the two `tunables` markers are the campaign's search space: each candidate is a patch
that rewrites some of those lines, so it passes the policy gate and lands in the audit log like any code change.
The defaults are a plain starting point (32-wide blocks, 4 warps, no pipelining, no split-KV), not tuned values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["attention"]

# --- tunables: a kernel campaign rewrites these lines (one `NAME = int` per line) ---
# One set per mode and head-dim class, since registers and shared memory per program scale with the head dim:
# D256 serves head_dim <= 256 (Gemma 4's sliding layers), D512 larger ones (its full-attention layers).
DECODE_D256_BLOCK_N = 32       # keys per step of the decode loop
DECODE_D256_SPLITS = 1         # programs per (sequence, kv head), each over a slice of the keys, then merged
DECODE_D256_NUM_WARPS = 4
DECODE_D256_NUM_STAGES = 1     # software pipelining depth of the key loop
DECODE_D512_BLOCK_N = 32
DECODE_D512_SPLITS = 1
DECODE_D512_NUM_WARPS = 4
DECODE_D512_NUM_STAGES = 1
PREFILL_D256_BLOCK_M = 32      # queries per program
PREFILL_D256_BLOCK_N = 32      # keys per step
PREFILL_D256_NUM_WARPS = 4
PREFILL_D256_NUM_STAGES = 1
PREFILL_D512_BLOCK_M = 32
PREFILL_D512_BLOCK_N = 32
PREFILL_D512_NUM_WARPS = 4
PREFILL_D512_NUM_STAGES = 1
# --- end of tunables ---


def _tunables(mode: str, head_dim: int) -> dict[str, int]:
    """This launch's tunables, read from the module at call time: {"BLOCK_N": ..., "SPLITS": ..., ...}."""
    prefix = f"{mode}_D{256 if head_dim <= 256 else 512}_"
    return {name.removeprefix(prefix): value for name, value in globals().items() if name.startswith(prefix)}


# The running max starts finite, so a row that has seen only masked keys never computes inf - inf.
_NEG: tl.constexpr = tl.constexpr(-1.0e30)


@triton.jit
def _softcap(scores, cap):
    # tanh through exp: the interpreter (CPU tests) and every Triton version have exp; tanh(x) = 1 - 2/(e^2x + 1)
    x = scores / cap
    return cap * (1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0))


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, o_ptr, part_acc_ptr, part_m_ptr, part_l_ptr,
                   stride_qb, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
                   stride_ob, stride_oh, kv_len, key_start, split_len, scale, cap,
                   NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, SOFTCAP: tl.constexpr):
    # One program per (sequence, kv head, split): all GROUP query heads of the kv head share each K/V tile, so
    # the cache is read once, not once per query head. The dot needs >= 16 rows: the group is padded.
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kvh * GROUP + offs_g
    g_mask = offs_g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=g_mask[:, None],
                other=0.0)
    lo = key_start + split * split_len
    hi = tl.minimum(lo + split_len, kv_len)
    m_i = tl.full([GROUP_PAD], _NEG, tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh
    v_base = v_ptr + b * stride_vb + kvh * stride_vh
    for start in range(lo, hi, BLOCK_N):
        n = start + offs_n
        n_mask = n < hi
        k_t = tl.load(k_base + n[None, :] * stride_kn + offs_d[:, None], mask=n_mask[None, :], other=0.0)
        scores = tl.dot(q, k_t) * scale
        if SOFTCAP:
            scores = _softcap(scores, cap)
        scores = tl.where(n_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + n[:, None] * stride_vn + offs_d[None, :], mask=n_mask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    if SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:
        # Partial results, [batch, heads, splits] (+ head_dim for acc), fp32: merged by _combine_kernel.
        row = (b * NUM_HEADS + heads) * SPLITS + split
        tl.store(part_m_ptr + row, m_i, mask=g_mask)
        tl.store(part_l_ptr + row, l_i, mask=g_mask)
        tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=g_mask[:, None])


@triton.jit
def _combine_kernel(part_acc_ptr, part_m_ptr, part_l_ptr, o_ptr, stride_ob, stride_oh,
                    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr,
                    SPLITS_PAD: tl.constexpr):
    # Merge the splits of one (sequence, head): rescale each partial sum to the common max, then normalise.
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    s_mask = offs_s < SPLITS
    row = (b * NUM_HEADS + h) * SPLITS + offs_s
    m = tl.load(part_m_ptr + row, mask=s_mask, other=_NEG)
    l_s = tl.load(part_l_ptr + row, mask=s_mask, other=0.0)
    acc = tl.load(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], mask=s_mask[:, None], other=0.0)
    w = tl.exp(m - tl.max(m, 0))
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l_s * w, 0)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty))


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, o_ptr,
                    stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
                    stride_vb, stride_vn, stride_vh, stride_ob, stride_om, stride_oh,
                    q_len, kv_len, window, scale, cap,
                    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr):
    # One program per (block of queries, sequence x query head). Only key blocks that some query of the block can
    # see are visited: [first query - window + 1, last query], rounded to whole blocks.
    mb = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // NUM_HEADS
    h = bh % NUM_HEADS
    kvh = h // GROUP
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    m_mask = offs_m < q_len
    pos = kv_len - q_len + offs_m
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=m_mask[:, None], other=0.0)
    first = kv_len - q_len + mb * BLOCK_M
    hi = tl.minimum(first + BLOCK_M, kv_len)
    lo = 0
    if WINDOW:
        lo = tl.maximum(first - window + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
    m_i = tl.full([BLOCK_M], _NEG, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh
    v_base = v_ptr + b * stride_vb + kvh * stride_vh
    for start in range(lo, hi, BLOCK_N):
        n = start + offs_n
        n_mask = n < kv_len
        k_t = tl.load(k_base + n[None, :] * stride_kn + offs_d[:, None], mask=n_mask[None, :], other=0.0)
        scores = tl.dot(q, k_t) * scale
        if SOFTCAP:
            scores = _softcap(scores, cap)
        visible = (n[None, :] <= pos[:, None]) & n_mask[None, :]
        if WINDOW:
            visible = visible & ((pos[:, None] - n[None, :]) < window)
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + n[:, None] * stride_vn + offs_d[None, :], mask=n_mask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=m_mask[:, None])


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or out.shape != q.shape:
        raise ValueError(f"shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, out {tuple(out.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[2] % k.shape[2]:
        raise ValueError("batch and head_dim must match, and q heads must be a multiple of kv heads")
    if q.shape[1] > k.shape[1]:
        raise ValueError(f"q_len {q.shape[1]} exceeds kv_len {k.shape[1]}")
    head_dim = q.shape[3]
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim {head_dim} must be a power of two >= 16")
    if any(t.stride(-1) != 1 for t in (q, k, v, out)):
        raise ValueError("the last dim of q, k, v and out must be contiguous")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, *, scale: float,
              sliding_window: int | None = None, softcap: float | None = None) -> None:
    """Write softmax(q k^T * scale) v into `out` (causal, GQA, optional sliding window and softcap)."""
    _check(q, k, v, out)
    batch, q_len, num_heads, head_dim = q.shape
    kv_len, num_kv_heads = k.shape[1], k.shape[2]
    group = num_heads // num_kv_heads
    cap = float(softcap or 0.0)
    if q_len == 1:
        t = _tunables("DECODE", head_dim)
        splits, block_n = t["SPLITS"], t["BLOCK_N"]
        key_start = max(0, kv_len - sliding_window) if sliding_window else 0
        split_len = triton.cdiv(triton.cdiv(kv_len - key_start, splits), block_n) * block_n
        parts = (batch, num_heads, splits)
        part_acc = out if splits == 1 else torch.empty((*parts, head_dim), device=q.device, dtype=torch.float32)
        part_m = out if splits == 1 else torch.empty(parts, device=q.device, dtype=torch.float32)
        part_l = out if splits == 1 else torch.empty(parts, device=q.device, dtype=torch.float32)
        _decode_kernel[(batch, num_kv_heads, splits)](
            q, k, v, out, part_acc, part_m, part_l,
            q.stride(0), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            out.stride(0), out.stride(2), kv_len, key_start, split_len, float(scale), cap,
            NUM_HEADS=num_heads, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
            BLOCK_N=block_n, SPLITS=splits, SOFTCAP=softcap is not None,
            num_warps=t["NUM_WARPS"], num_stages=t["NUM_STAGES"])
        if splits > 1:
            _combine_kernel[(batch, num_heads)](
                part_acc, part_m, part_l, out, out.stride(0), out.stride(2),
                NUM_HEADS=num_heads, HEAD_DIM=head_dim, SPLITS=splits, SPLITS_PAD=triton.next_power_of_2(splits),
                num_warps=4)
        return
    t = _tunables("PREFILL", head_dim)
    grid = (triton.cdiv(q_len, t["BLOCK_M"]), batch * num_heads)
    _prefill_kernel[grid](
        q, k, v, out,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        q_len, kv_len, int(sliding_window or 0), float(scale), cap,
        NUM_HEADS=num_heads, GROUP=group, HEAD_DIM=head_dim, BLOCK_M=t["BLOCK_M"], BLOCK_N=t["BLOCK_N"],
        WINDOW=bool(sliding_window), SOFTCAP=softcap is not None,
        num_warps=t["NUM_WARPS"], num_stages=t["NUM_STAGES"])
