"""The ceilings, measured on the GPU the kernels run on, in the same process: HBM bandwidth from a large
device-to-device copy (bytes read plus bytes written), and the bf16 matrix rate from an n^3 product on random
data. Datasheet numbers are leads only; what a kernel achieves is reported against these.

The served roofline (harness/ceilings.py) takes its ceilings from here too, on a CPU host as well (another dtype,
a wall-clock timer); beside each median it reports the fastest sample (`*_best`): what the host did at least once."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from harness.kernel.config import RooflineConfig, ShapeConfig
from harness.kernel.shapes import flops, min_bytes
from harness.kernel.timing import Timer

__all__ = ["measure_roofline", "attainment"]


def _copy_us(cfg: RooflineConfig, timer: Timer, device: torch.device) -> list[float]:
    src = torch.randn(cfg.copy_bytes // 2, device=device, dtype=torch.float32).to(torch.bfloat16)   # never zeros
    dst = torch.empty_like(src)
    timer.time_calls(lambda: dst.copy_(src), 3)
    samples = timer.time_calls(lambda: dst.copy_(src), cfg.repeats)
    if not torch.equal(dst, src):
        raise RuntimeError("the copy used to measure bandwidth did not copy: the ceiling would be wrong")
    return samples


def _matmul_us(n: int, repeats: int, timer: Timer, device: torch.device, dtype: torch.dtype) -> list[float]:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    timer.time_calls(lambda: a @ b, 3)
    return timer.time_calls(lambda: a @ b, repeats)


def measure_roofline(cfg: RooflineConfig, timer: Timer, *, device: torch.device,
                     dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    copies = _copy_us(cfg, timer, device)
    copy_us = statistics.median(copies)
    moved = 2 * (cfg.copy_bytes // 2) * 2          # bf16 elements, read once and written once
    products = _matmul_us(cfg.matmul_n, max(3, cfg.repeats // 2), timer, device, dtype)
    mm_us = statistics.median(products)
    n = cfg.matmul_n
    tflop_s = 2 * n**3 / mm_us / 1e6
    out = {"copy_bytes_moved": moved, "copy_us": copy_us, "hbm_gb_s": moved / copy_us / 1e3,
           "matmul_n": n, "matmul_us": mm_us, "matmul_dtype": str(dtype).removeprefix("torch."), "tflop_s": tflop_s,
           "hbm_gb_s_best": moved / min(copies) / 1e3, "tflop_s_best": 2 * n**3 / min(products) / 1e6,
           "hbm_gb_s_worst": moved / max(copies) / 1e3, "tflop_s_worst": 2 * n**3 / max(products) / 1e6}
    if dtype == torch.bfloat16:
        out["bf16_tflop_s"] = tflop_s
    return out


def attainment(shape: ShapeConfig, time_us: float, roofline: dict[str, Any] | None, *, itemsize: int) -> dict[str, Any]:
    """Work of the full job per second, and its share of each measured ceiling."""
    gb_s = min_bytes(shape, itemsize) / time_us / 1e3
    tflop_s = flops(shape) / time_us / 1e6
    out: dict[str, Any] = {"min_bytes": min_bytes(shape, itemsize), "flops": flops(shape),
                           "achieved_gb_s": gb_s, "achieved_tflop_s": tflop_s}
    if roofline:
        out["pct_hbm"] = 100.0 * gb_s / roofline["hbm_gb_s"]
        out["pct_bf16_flops"] = 100.0 * tflop_s / roofline["bf16_tflop_s"]
        # the floor: whichever of bytes and operations takes longer at the measured rates
        floor_us = max(min_bytes(shape, itemsize) / roofline["hbm_gb_s"] / 1e3,
                       flops(shape) / roofline["bf16_tflop_s"] / 1e6)
        out["roofline_floor_us"] = floor_us
        out["pct_of_roofline"] = 100.0 * floor_us / time_us
    return out
