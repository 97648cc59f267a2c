"""A host's ceilings for the served roofline: matmul FLOP/s at the served dtype, memory bandwidth, and the on-chip
cache a decode step's data could stay in. Measured here (`measure_ceilings`, with harness/kernel/roofline.py's
copy and matrix product: a few seconds) or taken from a datasheet by name (`named_ceilings`).

A measurement keeps its uncertainty: beside each median, the fastest and slowest samples. A cell is called
impossible only against the fastest (what this host did at least once), so the noise of the measurement never
makes a possible result impossible; on a GPU, fractions (MFU, bandwidth utilisation) are reported against the median
(within a few percent of the fastest), on a CPU against the fastest too (a shared host's median is its neighbours').
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.config import ServerConfig
from harness.errors import CeilingsUnavailable

__all__ = ["Ceilings", "DATASHEETS", "named_ceilings", "measure_ceilings", "served_ceilings", "cpu_cache_bytes",
           "flop_rate", "server_threads"]


@dataclass(frozen=True)
class Ceilings:
    flop_s: float             # matmul FLOP/s at `dtype`: the median of the samples, or a datasheet's dense peak
    bytes_s: float            # memory bandwidth (bytes read plus written per second of a large copy; datasheet)
    flop_s_best: float        # the fastest sample (a datasheet: its peak): the impossibility check uses these
    bytes_s_best: float
    cache_bytes: float        # caches a decode step's data could stay in between steps (L2 on a GPU)
    dtype: str
    source: str               # where the figures come from, in words
    spread: str = ""          # the measurement's uncertainty, in words

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, body: Any) -> Ceilings | None:
        """None for a body that is not a recorded Ceilings (an older log, an omitted measurement)."""
        fields = ("flop_s", "bytes_s", "flop_s_best", "bytes_s_best", "cache_bytes")
        if not isinstance(body, dict) or not all(isinstance(body.get(k), int | float) for k in fields):
            return None
        return cls(**{k: float(body[k]) for k in fields}, dtype=str(body.get("dtype") or ""),
                   source=str(body.get("source") or ""), spread=str(body.get("spread") or ""))

    def summary(self) -> str:
        text = (f"{flop_rate(self.flop_s)} ({self.dtype} matmul), {self.bytes_s / 1e9:,.1f} GB/s, "
                f"{self.cache_bytes / 2**20:,.0f} MiB cache; {self.source}")
        return f"{text}; {self.spread}" if self.spread else text


def flop_rate(flop_s: float) -> str:
    return f"{flop_s / 1e12:,.1f} TFLOP/s" if flop_s >= 1e12 else f"{flop_s / 1e9:,.1f} GFLOP/s"


# Dense (no sparsity) bf16/fp16 tensor-core peaks, memory bandwidth and L2, from NVIDIA's datasheets: "NVIDIA A100
# Tensor Core GPU" (2021: bf16 312 TFLOPS, 624 with sparsity; 1,555 GB/s 40 GB, 1,935 GB/s 80 GB PCIe, 2,039 GB/s
# 80 GB SXM; L2 40 MB), "NVIDIA H100 Tensor Core GPU" (bf16 1,979 / 1,513 / 1,671 TFLOPS with sparsity for SXM /
# PCIe / NVL, halved here; 3.35 / 2.0 / 3.9 TB/s; L2 50 MB), "NVIDIA H200 Tensor Core GPU" (the H100 SXM / NVL
# compute, 4.8 TB/s HBM3e), "NVIDIA L4" (bf16 242 TFLOPS with sparsity; 300 GB/s; L2 48 MB) and "NVIDIA L40S"
# (bf16 362.05, 733 with sparsity; 864 GB/s; L2 taken as AD102's full 96 MB: more cache only lowers a floor).
DATASHEETS: dict[str, tuple[float, float, float]] = {   # name: (dense bf16 TFLOP/s, GB/s, L2 MiB)
    "A100-40GB-SXM": (312.0, 1555.0, 40.0),
    "A100-40GB-PCIE": (312.0, 1555.0, 40.0),
    "A100-80GB-SXM": (312.0, 2039.0, 40.0),
    "A100-80GB-PCIE": (312.0, 1935.0, 40.0),
    "H100-SXM": (989.4, 3350.0, 50.0),
    "H100-PCIE": (756.5, 2000.0, 50.0),
    "H100-NVL": (835.5, 3900.0, 50.0),
    "H200-SXM": (989.4, 4800.0, 50.0),
    "H200-NVL": (835.5, 4800.0, 50.0),
    "L4": (121.0, 300.0, 48.0),
    "L40S": (362.05, 864.0, 96.0),
}
_ALIASES = {"A100": "A100-80GB-SXM", "H100": "H100-SXM", "H200": "H200-SXM"}


def named_ceilings(name: str, *, dtype: str = "bfloat16") -> Ceilings:
    """A GPU's datasheet ceilings (`DATASHEETS`; A100, H100, H200 alone mean their SXM parts). Its peak is bf16/fp16:
    another dtype is refused rather than scaled by a guess."""
    key = _ALIASES.get(name.upper(), name.upper())
    if key not in DATASHEETS:
        raise CeilingsUnavailable(f"no datasheet for {name!r}; known: {', '.join(DATASHEETS)} (or A100, H100, H200 "
                                  "for their SXM parts); or pass the peak and bandwidth yourself")
    if dtype not in ("bfloat16", "float16", "auto"):
        raise CeilingsUnavailable(f"the datasheet table holds bf16/fp16 peaks; {dtype} is not scaled from them: "
                                  "pass the peak at that dtype yourself")
    tflops, gb_s, l2_mib = DATASHEETS[key]
    return Ceilings(flop_s=tflops * 1e12, bytes_s=gb_s * 1e9, flop_s_best=tflops * 1e12, bytes_s_best=gb_s * 1e9,
                    cache_bytes=l2_mib * 2**20, dtype="bfloat16", source=f"datasheet: NVIDIA {key}")


def _size(text: str) -> int:
    text = text.strip().upper()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text and text[-1] in units else int(text or 0)


def cpu_cache_bytes(root: Path = Path("/sys/devices/system/cpu")) -> int:
    """Every data cache of the CPUs this process may run on, each shared cache once (0 when sysfs says nothing)."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    seen: dict[tuple[str, str], int] = {}
    for cpu in cpus:
        for index in sorted((root / f"cpu{cpu}" / "cache").glob("index*")):
            try:
                kind = (index / "type").read_text().strip()
                if kind == "Instruction":
                    continue
                key = ((index / "level").read_text().strip(), (index / "shared_cpu_list").read_text().strip())
                seen[key] = _size((index / "size").read_text())
            except (OSError, ValueError):
                continue
    return sum(seen.values())


def _spread(r: dict[str, Any]) -> str:
    return (f"{r['matmul_n']}^3 {r['matmul_dtype']} product {flop_rate(r['tflop_s_worst'] * 1e12)} to "
            f"{flop_rate(r['tflop_s_best'] * 1e12)} (median {flop_rate(r['tflop_s'] * 1e12)}), copy "
            f"{r['hbm_gb_s_worst']:,.1f} to {r['hbm_gb_s_best']:,.1f} GB/s (median {r['hbm_gb_s']:,.1f})")


def measure_ceilings(*, device: str, dtype: str, threads: int | None = None) -> Ceilings:
    """This host's ceilings at `dtype` on `device` ("cpu" or "cuda"): on a CPU, 30 512^3 products and 60 copies of
    128 MiB on one thread, wall-clock timed, times `threads` (as the server uses; default torch's): a few seconds;
    on a GPU the kernel harness's own ceilings (8192^3 product, 2 GiB copy, CUDA events; under a second)."""
    try:
        import torch

        from harness.kernel.config import RooflineConfig
        from harness.kernel.roofline import measure_roofline
        from harness.kernel.timing import WallTimer, make_timer
    except ImportError as exc:
        raise CeilingsUnavailable(f"torch is needed to measure this host's ceilings ({exc})") from None
    torch_dtype = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(torch_dtype, torch.dtype):
        raise CeilingsUnavailable(f"dtype {dtype!r} is not a torch dtype; the ceilings are not measured")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise CeilingsUnavailable("no CUDA device visible to this process: the GPU's ceilings are not measured "
                                      "(for a GPU only the sandbox sees, `ratchet claim --hardware NAME --results "
                                      "FILE` checks a measured grid against its datasheet)")
        dev = torch.device("cuda")
        r = measure_roofline(RooflineConfig(), make_timer(dev, flush_l2=False, hide_launch=False), device=dev,
                             dtype=torch_dtype)
        cache = float(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 0)
        where = f"measured on {torch.cuda.get_device_name(dev)}"
    else:
        # One thread, scaled by the server's threads: several threads of one product wait for each other whenever
        # the scheduler runs something else on a core (measured on a loaded 2-core host: 21 GFLOP/s on two threads
        # against 99 on one), and the impossibility check must never rest on a rate the host was too busy to show.
        # Perfect scaling makes this an upper bound, which only lowers a floor. The fastest sample is the ceiling
        # (fractions too): on a shared host the median says more about the neighbours (14 to 35 GFLOP/s per thread
        # in runs minutes apart here, while the fastest stayed at 83 to 99).
        before = torch.get_num_threads()
        scale = threads or before
        try:
            torch.set_num_threads(1)
            r = measure_roofline(RooflineConfig(copy_bytes=128 << 20, matmul_n=512, repeats=60), WallTimer(),
                                 device=torch.device("cpu"), dtype=torch_dtype)
        finally:
            torch.set_num_threads(before)
        where = f"measured on this CPU: one thread's fastest sample x {scale} threads (an upper bound)"
        flop_s, bytes_s = scale * r["tflop_s_best"] * 1e12, scale * r["hbm_gb_s_best"] * 1e9
        return Ceilings(flop_s=flop_s, bytes_s=bytes_s, flop_s_best=flop_s, bytes_s_best=bytes_s,
                        cache_bytes=float(cpu_cache_bytes()), dtype=str(r["matmul_dtype"]), source=where,
                        spread="per thread: " + _spread(r))
    return Ceilings(flop_s=r["tflop_s"] * 1e12, bytes_s=r["hbm_gb_s"] * 1e9, flop_s_best=r["tflop_s_best"] * 1e12,
                    bytes_s_best=r["hbm_gb_s_best"] * 1e9, cache_bytes=cache, dtype=str(r["matmul_dtype"]),
                    source=where, spread=_spread(r))


def server_threads(env: dict[str, str]) -> int | None:
    """The CPU threads a vLLM CPU server computes with, when its env says (OMP_NUM_THREADS, or the CPUs listed in
    VLLM_CPU_OMP_THREADS_BIND such as "0-3" or "0,2"); None: torch's default, one per core."""
    if env.get("OMP_NUM_THREADS", "").isdigit():
        return int(env["OMP_NUM_THREADS"])
    bind = env.get("VLLM_CPU_OMP_THREADS_BIND", "")
    if not bind or bind in ("auto", "all"):
        return None
    count = 0
    for part in bind.split("|")[0].split(","):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            return None
        count += int(last) - int(first) + 1 if last else 1
    return count or None


def served_ceilings(server: ServerConfig, *, hardware: str, timeout_s: float = 300.0) -> Ceilings:
    """This host's ceilings for a served configuration: at its dtype ("auto": the checkpoint's, else bfloat16), on
    the GPU or with the CPU threads its server computes with. Measured once, at a campaign's or measure's start, in a
    child process: a CUDA context (and the allocator's cached gigabytes) must not stay in the campaign's process
    beside the servers it starts."""
    dtype = str(server.engine_args.get("dtype") or "auto")
    if dtype == "auto":
        try:
            cfg = json.loads((server.model / "config.json").read_text())
        except (OSError, ValueError):
            cfg = {}
        dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
    dtype = {"float": "float32", "half": "float16"}.get(dtype, dtype)
    threads = server_threads(dict(server.env)) if hardware != "gpu" else None
    argv = [sys.executable, "-m", "harness.ceilings", "--device", "cuda" if hardware == "gpu" else "cpu",
            "--dtype", dtype, *(["--threads", str(threads)] if threads else [])]
    root = str(Path(__file__).resolve().parents[1])    # this harness, whatever the caller's working directory
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env,
                              start_new_session=True, check=False)
    except subprocess.TimeoutExpired:
        raise CeilingsUnavailable(f"measuring the ceilings took over {timeout_s:.0f} s") from None
    lines = proc.stdout.strip().splitlines()
    ceilings = Ceilings.from_json(json.loads(lines[-1])) if proc.returncode == 0 and lines else None
    if ceilings is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise CeilingsUnavailable(f"{' '.join(argv[1:])} failed (exit {proc.returncode}): {tail}")
    return ceilings


def _main(argv: list[str] | None = None) -> int:
    """`python -m harness.ceilings --device cpu|cuda --dtype D [--threads N]`: one JSON line of Ceilings, or exit 3
    with the reason on stderr."""
    parser = argparse.ArgumentParser(prog="python -m harness.ceilings")
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args(argv)
    try:
        ceilings = measure_ceilings(device=args.device, dtype=args.dtype, threads=args.threads)
    except CeilingsUnavailable as exc:
        print(exc, file=sys.stderr)
        return 3
    print(json.dumps(ceilings.to_json()))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
