"""Hand-written Chrome traces shaped like a vLLM GPU worker's torch profiler trace, for the step tests.

One engine process (pid 100, thread 100) records the step ranges, CPU ops and runtime calls; the device (pid 0)
records kernels on stream 7 and copies on stream 13. A decode step replays one CUDA graph (norm, GEMM, the
attention of every layer, the PLE gather: each kernel with `graph id` and the `cudaGraphLaunch`'s correlation),
then launches the lm_head GEMM (its aten::mm has the vocabulary in its input dims), the softcap's divide, tanh
and multiply, and a greedy argmax that runs late, past the next step's start.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Event = dict[str, Any]
SLIDING = {"grid": [1, 1, 1], "block": [128, 1, 1], "shared memory": 16384, "registers per thread": 128}
FULL = {"grid": [1, 1, 1], "block": [128, 1, 1], "shared memory": 65536, "registers per thread": 168}
ATTENTION = "kernel_unified_attention"
DIV = ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
       "at::native::binary_internal::DivFunctor<float> > >(int, at::native::BinaryFunctor<float>)")
TANH = ("void at::native::vectorized_elementwise_kernel<4, at::native::tanh_kernel_cuda(at::TensorIteratorBase&)"
        "::{lambda()#2}::operator()() const::{lambda(float)#1}>(int, float)")
MUL = "void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float> >(int, float)"
ARGMAX = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, "
          "unsigned int, long, 4> >(at::native::ReduceOp<float>)")
LM_HEAD = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"


@dataclass
class TraceBuilder:
    events: list[Event] = field(default_factory=list)
    corr: int = 10

    def host(self, name: str, ts: float, dur: float, cat: str = "cpu_op", **args: Any) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": dur,
                            "args": args})

    def step(self, ts: float, dur: float, context: tuple[int, int], generation: tuple[int, int]) -> None:
        name = f"execute_context_{context[0]}({context[1]})_generation_{generation[0]}({generation[1]})"
        self.host(name, ts, dur, cat="user_annotation")

    def launch(self, ts: float, name: str = "cudaLaunchKernel", dur: float = 1.0) -> int:
        self.corr += 1
        self.host(name, ts, dur, cat="cuda_runtime", correlation=self.corr)
        return self.corr

    def device(self, name: str, ts: float, dur: float, corr: int, *, stream: int = 7, cat: str = "kernel",
               **args: Any) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                            "args": {"stream": stream, "correlation": corr, **args}})

    def decode_step(self, t0: float, *, gemm_us: float, sliding: int = 4, full: int = 1, vocab: int = 1000,
                    ranges: bool = True) -> None:
        """A decode step from t0 to t0 + 1000 (the next one starts there). Device busy 420 µs with gemm_us 80."""
        if ranges:
            self.step(t0, 300, (0, 0), (2, 2))
        graph = self.launch(t0 + 50, "cudaGraphLaunch", dur=20)
        self.device("Memcpy HtoD (Pinned -> Device)", t0 + 90, 40, graph, stream=13, cat="gpu_memcpy")
        t = t0 + 100
        for node, (name, dur, args) in enumerate([("triton_red_fused_add_mean_mul_pow_rsqrt_0", 20, {}),
                                                  ("nvjet_tst_64x8_64x16_1x4_h_bz_TNT", gemm_us, {}),
                                                  *[(ATTENTION, 10, SLIDING)] * sliding,
                                                  *[(ATTENTION, 30, FULL)] * full,
                                                  ("triton_poi_fused_embedding_mul_where_0", 10, {})], start=1):
            self.device(name, t, dur, graph, **args, **{"graph id": 7, "graph node id": node})
            t += dur
        self.host("aten::empty", t0 + 150, 10)                  # host work under the graph: not exposed
        self.host("aten::mm", t0 + 295, 10, **{"External id": 555 + int(t0), "Input Dims": [[2, 64], [64, vocab]]})
        head = self.launch(t0 + 300)
        at = max(t0 + 400, t + 20)                               # after the graph, on the same stream
        self.device(LM_HEAD, at, 100, head, **{"External id": 555 + int(t0)})
        for i, (name, start) in enumerate([(DIV, 100), (TANH, 110), (MUL, 120)]):
            self.device(name, at + start, 10, self.launch(t0 + 306 + i))
        self.device(ARGMAX, t0 + 950, 100, self.launch(t0 + 309))    # runs past the next step's start
        self.host("aten::copy_", t0 + 320, 70)                       # host work while the device idles

    def prefill_step(self, t0: float) -> None:
        self.step(t0, 800, (2, 1024), (0, 0))
        self.device("nvjet_tst_256x128_64x4_2x1_v_bz_TNN", t0 + 100, 300, self.launch(t0 + 20))
        self.device(ATTENTION, t0 + 400, 200, self.launch(t0 + 30), **SLIDING)

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = [{"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "args": {"name": "VLLM::Worker"}}]
        with gzip.open(path, "wt") as f:
            json.dump({"schemaVersion": 1, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
                       "traceEvents": meta + self.events}, f)
        return path


def engine_trace(*, sliding: int = 4, full: int = 1, vocab: int = 1000, ranges: bool = True) -> TraceBuilder:
    """A prefill step at 0, then decode steps at 1000, 2000, 3000 with GEMMs of 80, 120 and 100 µs."""
    trace = TraceBuilder()
    if ranges:
        trace.prefill_step(0)
    for t0, gemm in ((1000, 80), (2000, 120), (3000, 100)):
        trace.decode_step(t0, gemm_us=gemm, sliding=sliding, full=full, vocab=vocab, ranges=ranges)
    return trace
