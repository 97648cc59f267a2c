"""The reference the kernel is compared with: plain attention in float64 (or float32) on upcast inputs.

GQA without copying K/V: the query heads of one kv head become extra rows, so q of [b, kvh, group * q_len, d]
meets k of [b, kvh, kv_len, d] in one batched product (a decode batch of 64 x 4096 keys at d=512 would
otherwise be copied 8 times in float64: 8.6 GB).
"""

from __future__ import annotations

import torch

from harness.kernel.config import ShapeConfig

__all__ = ["reference_attention"]


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: ShapeConfig,
                        *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """softmax(q k^T * scale, causal + window mask, optional softcap) v, in `dtype`, shaped like q. A mixed batch
    (flat q, harness/kernel/correctness.py's make_inputs) is computed kind by kind of sequence, each over its keys."""
    if not shape.decodes:
        return _attention(q, k, v, shape, dtype)
    outs, row, seq = [], 0, 0
    heads, d = q.shape[1], q.shape[2]
    for n, q_len, kv_len in shape.groups:
        part = q[row: row + n * q_len].view(n, q_len, heads, d)
        keys, values = k[seq: seq + n, :kv_len], v[seq: seq + n, :kv_len]
        outs.append(_attention(part, keys, values, shape, dtype).reshape(n * q_len, heads, d))
        row, seq = row + n * q_len, seq + n
    return torch.cat(outs)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: ShapeConfig,
               dtype: torch.dtype) -> torch.Tensor:
    b, q_len, heads, d = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    # [b, q_len, kvh * group, d] -> [b, kvh, group * q_len, d]: row r is query r % q_len of head r // q_len
    qr = q.to(dtype).view(b, q_len, kv_heads, group, d).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, group * q_len, d)
    kr = k.to(dtype).permute(0, 2, 1, 3)
    vr = v.to(dtype).permute(0, 2, 1, 3)
    scores = torch.matmul(qr, kr.transpose(-1, -2)) * shape.scale
    if shape.softcap is not None:
        scores = shape.softcap * torch.tanh(scores / shape.softcap)
    pos = (kv_len - q_len + torch.arange(q_len, device=q.device)).repeat(group)[:, None]
    key = torch.arange(kv_len, device=q.device)[None, :]
    visible = key <= pos
    if shape.sliding_window is not None:
        visible &= (pos - key) < shape.sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), vr)          # [b, kvh, group * q_len, d]
    return out.view(b, kv_heads, group, q_len, d).permute(0, 3, 1, 2, 4).reshape(b, q_len, heads, d)
