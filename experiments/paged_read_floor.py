"""The floor under vLLM's paged decode at the 64-sequence sliding-window shape (E2B's d256 layers: 64 sequences of
4,096 tokens, a 512-token window, 16-token blocks in shuffled order, 1 kv head): a Triton kernel that only reads
the window's K and V through the block table (and sums them, so the loads stay), in the same grids the decode
kernel uses (sequence x split), timed as CUDA-graph replays after an L2 flush, like vllm_kernel_variants.py.
What it answers: how close to the copy bandwidth a read of these 33.5 MB can get in one launch at all, i.e.
whether issue 17's >= 50 % target for that decode is reachable by a kernel of this shape.
    DIR=<folder with vLLM 0.26's helpers.py> FLUSH=read python3 experiments/paged_read_floor.py
"""

import json
import os
import sys

import torch
import triton
from triton import language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_kernel_variants as kv  # noqa: E402  (its stubs, shapes, inputs and timer)


@triton.jit
def read_window(key_ptr, value_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, bt_stride, stride_0, stride_1,
                BLOCK_SIZE: tl.constexpr, HEAD_SIZE: tl.constexpr, TILE: tl.constexpr, SPLITS: tl.constexpr,
                WINDOW: tl.constexpr):
    seq = tl.program_id(0)
    split = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    lo = tl.maximum(seq_len - WINDOW, 0)
    share = ((seq_len - lo + SPLITS - 1) // SPLITS + TILE - 1) // TILE * TILE
    start = lo + split * share
    end = tl.minimum(start + share, seq_len)
    offs_t = tl.arange(0, TILE)
    offs_d = tl.arange(0, HEAD_SIZE)
    acc = tl.zeros([TILE, HEAD_SIZE], dtype=tl.float32)
    for j in range(start, end, TILE):
        n = j + offs_t
        mask = n < end
        blk = tl.load(block_tables_ptr + seq.to(tl.int64) * bt_stride + n // BLOCK_SIZE, mask=mask, other=0)
        rows = blk.to(tl.int64) * stride_0 + (n % BLOCK_SIZE) * stride_1
        k = tl.load(key_ptr + rows[:, None] + offs_d[None, :], mask=mask[:, None], other=0.0)
        v = tl.load(value_ptr + rows[:, None] + offs_d[None, :], mask=mask[:, None], other=0.0)
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(out_ptr + seq * SPLITS + split, tl.sum(tl.sum(acc, 1), 0))


def main():
    bw = kv.ceil_bw()
    shape = next(s for s in kv.SHAPES if s["name"] == "decode-b64-sliding-d256")
    x = kv.make(shape)
    byts, _ = kv.cost(shape)
    rows = []

    def record(build, t):
        row = dict(build=build, us=round(t, 2), pct_hbm=round(100 * byts / bw / (t * 1e-6), 1))
        rows.append(row)
        print(json.dumps(row), flush=True)

    empty = torch.empty(1, device=kv.dev)
    record("empty launch (torch add_ on 1 element)", kv.timed(lambda: empty.add_(1), True))
    flat = torch.empty(byts // 2, dtype=torch.bfloat16, device=kv.dev)
    record("contiguous read of the same bytes (torch sum)", kv.timed(lambda: flat.sum(dtype=torch.float32), True))
    K, V, bt, sk = x["K"], x["V"], x["bt"], x["sk"]
    for splits in (1, 2, 4, 8, 16):
        for tile in (16, 32, 64):
            for warps in (4, 8):
                out = torch.empty(len(sk) * splits, device=kv.dev)

                def run(splits=splits, tile=tile, warps=warps, out=out):
                    read_window[(len(sk), splits)](K, V, bt, sk, out, bt.stride(0), K.stride(0), K.stride(1),
                                                   BLOCK_SIZE=16, HEAD_SIZE=256, TILE=tile, SPLITS=splits,
                                                   WINDOW=shape["W"], num_warps=warps)
                record(f"paged window read, splits {splits}, tile {tile}, warps {warps}", kv.timed(run, True))
    best = min(rows[2:], key=lambda r: r["us"])
    print(f"copy {bw / 1e9:.0f} GB/s; {byts / 1e6:.1f} MB read; 50 % of bandwidth is "
          f"{byts / bw / 0.5 * 1e6:.1f} us; the fastest paged read: {best}")
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "paged-read-floor.json"), "w") as f:
        json.dump(dict(copy_GBps=bw / 1e9, bytes=byts, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
