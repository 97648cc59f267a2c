"""vLLM 0.26's unified attention at E2B shapes on one GPU: stock, the best before paged-fast-paths.patch, and with
it, plus variants of its launch parameters (the exploration behind the patch's values, before the campaign that
accepted it: results/vllm-kernel-paged-h200.md). Stubs vLLM's package imports; only the Triton kernels run, so no
vLLM install is needed. Adds a mixed batch (a 2,048-token chunk beside 63 decodes) the kernel harness has no shape
for, and FLUSH=read|zero picks how the L2 is flushed before each timed call.

Inputs beside this file (DIR below): helpers.py and stock.py, vLLM 0.26.0's triton_attention_helpers.py and
triton_unified_attention.py from its wheel; best.py, stock.py with kernels/vllm_unified_attention/
vllm-0.26-gemma4-tunables.patch, window-segments.patch, h200-prefill-tunables.patch and h200-prefill-d512-m64w8.patch
applied in that order; new.py, best.py with paged-fast-paths.patch.
    VARIANTS='{"DECODE_D256": [{"SPLITS": 4}]}' ONLY=decode FLUSH=read python3 vllm_kernel_variants.py
BUILDS=stock,new,next picks the builds (files DIR/<build>.py); a VARIANTS key "next:DECODE_D256" varies build next.
"""

import enum
import importlib.util
import itertools
import json
import os
import sys
import types

import torch
import triton
from triton import language as tl


def stub(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


class KVQuantMode(enum.IntEnum):
    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4


class Plat:
    def fp8_dtype(self):
        return torch.float8_e4m3fn

    def is_device_capability_family(self, x):
        return torch.cuda.get_device_capability()[0] * 10 // 10 == x // 10


for n in ("vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.ops"):
    stub(n)
stub("vllm.envs", VLLM_BATCH_INVARIANT=False)
stub("vllm.logger", init_logger=lambda n: None)
stub("vllm.platforms", current_platform=Plat())
stub("vllm.triton_utils", tl=tl, triton=triton)
stub("vllm.v1.kv_cache_interface", KVQuantMode=KVQuantMode)
HERE = os.environ.get("DIR") or os.path.dirname(os.path.abspath(__file__))


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


load(f"{HERE}/helpers.py", "vllm.v1.attention.ops.triton_attention_helpers")
dev = "cuda"
H, HKV = 8, 1
OUT = os.environ.get("OUT", "/tmp")
flush_buf = torch.zeros(512 << 20, dtype=torch.uint8, device=dev)
flush_sink = torch.zeros((), dtype=torch.int64, device=dev)


def ceil_bw():
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    t = triton.testing.do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    return 2 * n / (t * 1e-3)


def timed(fn, graph, reps=30):
    if graph:
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            fn()
            fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    else:
        run = fn
    for _ in range(3):
        run()
    ts = []
    for _ in range(reps):
        if os.environ.get("FLUSH") == "read":
            flush_sink.copy_(
                flush_buf.view(torch.int32).sum(dtype=torch.int64)
            )  # reads: clean lines, nothing to write back
        else:
            flush_buf.zero_()
        if not graph:
            torch.cuda._sleep(2_000_000)  # the GPU stays busy while the host launches: no launch overhead timed
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


SHAPES = [
    dict(name="decode-b64-sliding-d256", seqs=[(1, 4096)] * 64, D=256, W=512),
    dict(name="decode-b64-full-d512", seqs=[(1, 4096)] * 64, D=512, W=None),
    dict(name="decode-b16-full-d512-8k", seqs=[(1, 8192)] * 16, D=512, W=None),
    dict(name="decode-b256-sliding-d256", seqs=[(1, 4096)] * 256, D=256, W=512),
    dict(name="decode-b256-full-d512", seqs=[(1, 4096)] * 256, D=512, W=None),
    dict(name="prefill-4096-sliding-d256", seqs=[(4096, 4096)], D=256, W=512),
    dict(name="prefill-4096-full-d512", seqs=[(4096, 4096)], D=512, W=None),
    dict(name="prefill-chunk-2048-of-8192-full-d512", seqs=[(2048, 8192)], D=512, W=None),
    dict(name="mixed-2048of8192+63x4096-sliding-d256", seqs=[(2048, 8192)] + [(1, 4096)] * 63, D=256, W=512),
    dict(name="mixed-2048of8192+63x4096-full-d512", seqs=[(2048, 8192)] + [(1, 4096)] * 63, D=512, W=None),
]


def make(shape, seed=0, bs=16):
    g = torch.Generator(device=dev).manual_seed(seed)
    D = shape["D"]
    seqs = shape["seqs"]
    nblk = [(kv + bs - 1) // bs for _, kv in seqs]
    total = sum(nblk) + 7
    K = torch.randn(total, bs, HKV, D, device=dev, generator=g, dtype=torch.bfloat16)
    V = torch.randn(total, bs, HKV, D, device=dev, generator=g, dtype=torch.bfloat16)
    perm = torch.randperm(total, device=dev, generator=g).to(torch.int32)
    bt = torch.zeros(len(seqs), max(nblk), dtype=torch.int32, device=dev)
    o = 0
    for i, nb in enumerate(nblk):
        bt[i, :nb] = perm[o : o + nb]
        o += nb
    ql = [q for q, _ in seqs]
    T = sum(ql)
    q = torch.randn(T, H, D, device=dev, generator=g, dtype=torch.bfloat16)
    cu = torch.tensor([0] + list(itertools.accumulate(ql)), dtype=torch.int32, device=dev)
    sk = torch.tensor([kv for _, kv in seqs], dtype=torch.int32, device=dev)
    thr, seg = 128, 16
    Dp = triton.next_power_of_2(D)
    bufs = (
        torch.empty(thr, H, seg, Dp, device=dev),
        torch.empty(thr, H, seg, device=dev),
        torch.empty(thr, H, seg, device=dev),
    )
    return dict(
        max_k=max(kv for _, kv in seqs),
        K=K,
        V=V,
        bt=bt,
        q=q,
        cu=cu,
        sk=sk,
        ql=ql,
        nblk=nblk,
        bufs=bufs,
        thr=thr,
        seg=seg,
    )


def call(mod, x, shape, out):
    W = shape["W"]
    so, sm, se = x["bufs"]
    mod.unified_attention(
        q=x["q"],
        k=x["K"],
        v=x["V"],
        out=out,
        cu_seqlens_q=x["cu"],
        max_seqlen_q=max(x["ql"]),
        seqused_k=x["sk"],
        max_seqlen_k=x["max_k"],
        softmax_scale=shape["D"] ** -0.5,
        causal=True,
        window_size=(W - 1, 0) if W else (-1, -1),
        block_table=x["bt"],
        softcap=0,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        seq_threshold_3D=x["thr"],
        num_par_softmax_segments=x["seg"],
        softmax_segm_output=so,
        softmax_segm_max=sm,
        softmax_segm_expsum=se,
    )


def check(out, x, shape, which):
    D, W = shape["D"], shape["W"]
    worst = 0.0
    cu = x["cu"].tolist()
    for i in which:
        (ql, kv), nb = shape["seqs"][i], x["nblk"][i]
        blocks = x["bt"][i, :nb].long()
        Kf = x["K"][blocks].reshape(-1, HKV, D)[:kv].float()
        Vf = x["V"][blocks].reshape(-1, HKV, D)[:kv].float()
        qi = x["q"][cu[i] : cu[i + 1]].float()
        pos = torch.arange(kv - ql, kv, device=dev)[:, None]
        kp = torch.arange(kv, device=dev)[None, :]
        m = kp <= pos
        if W:
            m &= (pos - kp) < W
        ref = torch.nn.functional.scaled_dot_product_attention(
            qi.transpose(0, 1),
            Kf.transpose(0, 1).expand(H, -1, -1),
            Vf.transpose(0, 1).expand(H, -1, -1),
            attn_mask=m,
            scale=D**-0.5,
        )
        got = out[cu[i] : cu[i + 1]].float().transpose(0, 1)
        if torch.isnan(got).any():
            return float("nan")
        worst = max(worst, float((got - ref).norm() / ref.norm()))
    return worst


def cost(shape):
    D, W = shape["D"], shape["W"]
    byts = flops = 0
    for ql, kv in shape["seqs"]:
        lo_first = max(0, kv - ql - (W - 1)) if W else 0
        seen = kv - lo_first if ql > 1 else (min(kv, W) if W else kv)
        byts += 2 * seen * HKV * D * 2 + 2 * ql * H * D * 2
        for_pairs = sum(min(p + 1, W) if W else p + 1 for p in range(kv - ql, kv)) if ql > 1 else seen
        flops += 4 * for_pairs * H * D
    return byts, flops


def main():
    bw = ceil_bw()
    print(f"copy {bw / 1e9:.0f} GB/s", flush=True)
    builds = os.environ.get("BUILDS", "stock,best,new").split(",")
    mods = {n: load(f"{HERE}/{n}.py", f"ua_{n}") for n in builds}
    variants = json.loads(os.environ.get("VARIANTS", "{}"))
    only = os.environ.get("ONLY")
    rows = []
    for shape in SHAPES:
        if only and not any(o in shape["name"] for o in only.split(",")):
            continue
        x = make(shape)
        graph = max(x["ql"]) == 1
        byts, flops = cost(shape)
        which = sorted({0, len(shape["seqs"]) - 1, len(shape["seqs"]) // 2})
        runs = [(n, {}) for n in mods]
        cls = "D256" if shape["D"] <= 256 else "D512"
        path = "PREFILL" if max(x["ql"]) > 1 else "DECODE"
        for key, build in [(f"{path}_{cls}", "new")] + [(f"{b}:{path}_{cls}", b) for b in builds]:
            for v in variants.get(key, []):
                runs.append((build, {f"PAGED_{path}_{cls}_{k}": val for k, val in v.items()}))
        base = None
        for n, tun in runs:
            mod = mods[n]
            saved = {k: getattr(mod, k) for k in tun}
            for k, val in tun.items():
                setattr(mod, k, val)
            label = n + ("" if not tun else " " + ",".join(f"{k.split('_', 3)[-1]}={val}" for k, val in tun.items()))
            out = torch.full_like(x["q"], float("nan"))
            try:
                call(mod, x, shape, out)
                torch.cuda.synchronize()
                err = check(out, x, shape, which)
                t = timed(lambda mod=mod, x=x, shape=shape, out=out: call(mod, x, shape, out), graph)
                err2 = check(out, x, shape, which)
                row = dict(
                    shape=shape["name"],
                    build=label,
                    us=round(t, 1),
                    pct_hbm=round(100 * byts / bw / (t * 1e-6), 1),
                    tflops=round(flops / (t * 1e-6) / 1e12, 1),
                    rel_l2=round(max(err, err2), 5),
                )
                if n == "stock":
                    base = t
                row["x_stock"] = round(base / t, 3) if base else None
            except Exception as e:
                row = dict(shape=shape["name"], build=label, error=f"{type(e).__name__}: {str(e)[:300]}")
            for k, val in saved.items():
                setattr(mod, k, val)
            rows.append(row)
            print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    with open(f"{OUT}/kdev.json", "w") as f:
        json.dump(dict(copy_GBps=bw / 1e9, rows=rows), f, indent=1)
    print("\n| shape | build | µs | x stock | % HBM | TFLOP/s | rel L2 |")
    for r in rows:
        if "error" in r:
            print(f"| {r['shape']} | {r['build']} | error {r['error'][:120]} |")
        else:
            print(
                f"| {r['shape']} | {r['build']} | {r['us']} | {r['x_stock']} | {r['pct_hbm']} | {r['tflops']} "
                f"| {r['rel_l2']} |"
            )


if __name__ == "__main__":
    main()
