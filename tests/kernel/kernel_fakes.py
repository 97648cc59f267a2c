"""Plain-torch "kernels" for the kernel harness's tests: one right, and one for each way a kernel can cheat or
break. Each has the entry signature of experiments/kernels/gemma4_attention (writes `out`, returns None)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from harness.kernel.config import ShapeConfig
from harness.kernel.reference import reference_attention


def _shape_of(q: torch.Tensor, k: torch.Tensor, scale: float, window: int | None, softcap: float | None) -> ShapeConfig:
    return ShapeConfig(name="x", batch=q.shape[0], q_len=q.shape[1], kv_len=k.shape[1], num_q_heads=q.shape[2],
                       num_kv_heads=k.shape[2], head_dim=q.shape[3], sliding_window=window, softcap=softcap)


def good(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, *, scale: float,
         sliding_window: int | None = None, softcap: float | None = None) -> None:
    out.copy_(reference_attention(q, k, v, _shape_of(q, k, scale, sliding_window, softcap), dtype=torch.float32))


def mutates_input(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, **kw: Any) -> None:
    good(q, k, v, out, **kw)
    k.mul_(0.5)         # e.g. an in-place scale of K reused as scratch: right now, wrong for the next call


def constant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, **kw: Any) -> None:
    out.fill_(0.0)      # KernelBench's all-zeros pass


def leaves_nan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, **kw: Any) -> None:
    full = torch.empty_like(out)
    good(q, k, v, full, **kw)
    out[:, :, : out.shape[2] // 2] = full[:, :, : out.shape[2] // 2]    # half the heads never written


def ignores_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, *, scale: float,
                   sliding_window: int | None = None, softcap: float | None = None) -> None:
    good(q, k, v, out, scale=scale, sliding_window=None, softcap=softcap)


def raises(*args: Any, **kw: Any) -> None:
    raise RuntimeError("out of shared memory (planted)")


class WrongAfter:
    """Right for its first `n` calls, then off by a little: passes a check before timing, not after."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, **kw: Any) -> None:
        self.calls += 1
        good(q, k, v, out, **kw)
        if self.calls > self.n:
            out.mul_(1.1)


TREE_KERNEL = '''"""A plain-torch attention "kernel" with tunables, for campaign tests."""
import torch

REPEATS = 4
WRONG = 0
AFTER = 0
MEMO = 0
_calls = [0]
_last = [None]


def _attn(q, k, v, scale, window):
    b, lq, h, d = q.shape
    lk, hk = k.shape[1], k.shape[2]
    g = h // hk
    qf = q.float().permute(0, 2, 1, 3)
    kf = k.float().permute(0, 2, 1, 3).repeat_interleave(g, 1)
    vf = v.float().permute(0, 2, 1, 3).repeat_interleave(g, 1)
    s = qf @ kf.transpose(-1, -2) * scale
    pos = torch.arange(lk - lq, lk)[:, None]
    j = torch.arange(lk)[None, :]
    vis = j <= pos
    if window:
        vis &= (pos - j) < window
    if WRONG:
        vis = torch.ones_like(vis)
    s = s.masked_fill(~vis, float("-inf"))
    return (s.softmax(-1) @ vf).permute(0, 2, 1, 3)


def attention(q, k, v, out, *, scale, sliding_window=None, softcap=None):
    _calls[0] += 1
    if MEMO and _last[0] == (q.data_ptr(), out.data_ptr()):
        return          # "same inputs as last time": the answer is already in out (it is not: out was re-poisoned)
    _last[0] = (q.data_ptr(), out.data_ptr())
    for _ in range(REPEATS):
        res = _attn(q, k, v, scale, sliding_window)
    out.copy_(res)
    if AFTER and _calls[0] > AFTER:
        out.mul_(1.1)
'''


def write_tree(root: Path, *, repeats: int = 4, wrong: int = 0, after: int = 0, memo: int = 0,
               package: str = "torchattn") -> Path:
    """A kernel target folder: root/<package>/attention.py; returns the folder. `wrong`: no causal mask;
    `after`: right for that many calls, then off by 10 %; `memo`: skips the work when called again on the
    same tensors (as the timed calls are; every check draws fresh ones)."""
    folder = root / package
    folder.mkdir(parents=True, exist_ok=True)
    text = TREE_KERNEL.replace("REPEATS = 4", f"REPEATS = {repeats}").replace("WRONG = 0", f"WRONG = {wrong}")
    text = text.replace("AFTER = 0", f"AFTER = {after}").replace("MEMO = 0", f"MEMO = {memo}")
    (folder / "attention.py").write_text(text)
    return folder
