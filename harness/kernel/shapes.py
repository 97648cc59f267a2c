"""What one attention call must do at the least: the operations it must execute and the bytes it must move.

Both are counted from the shape alone (never from the kernel), so a kernel that skips work cannot look
efficient: its figures are work done per second of the *full* job, against the measured ceilings.
"""

from __future__ import annotations

from harness.kernel.config import ShapeConfig

__all__ = ["visible_pairs", "keys_read", "flops", "min_bytes"]


def _seen(position: int, window: int | None) -> int:
    """Keys a query at `position` sees: itself and all before it, or the `window` most recent."""
    return position + 1 if window is None else min(position + 1, window)


def _pairs(q_len: int, kv_len: int, window: int | None) -> int:
    first = kv_len - q_len
    return sum(_seen(first + i, window) for i in range(q_len))


def _keys(q_len: int, kv_len: int, window: int | None) -> int:
    first = kv_len - q_len
    return kv_len - (first - _seen(first, window) + 1)


def visible_pairs(shape: ShapeConfig) -> int:
    """(query, key) pairs that enter the softmax, per query head, over every sequence of the call."""
    return sum(n * _pairs(q, k, shape.sliding_window) for n, q, k in shape.groups)


def keys_read(shape: ShapeConfig) -> int:
    """Keys some query needs, over every sequence: from the oldest one a sequence's first query sees to its last."""
    return sum(n * _keys(q, k, shape.sliding_window) for n, q, k in shape.groups)


def flops(shape: ShapeConfig) -> int:
    """Two matrix products (q k^T and p v), 2 operations per multiply-add each; softmax not counted."""
    return 4 * shape.head_dim * visible_pairs(shape) * shape.num_q_heads


def min_bytes(shape: ShapeConfig, itemsize: int) -> int:
    """q read once, out written once, each needed key and value row of each kv head read once."""
    q_and_out = 2 * shape.tokens * shape.num_q_heads * shape.head_dim
    kv = 2 * keys_read(shape) * shape.num_kv_heads * shape.head_dim
    return (q_and_out + kv) * itemsize
