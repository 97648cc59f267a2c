"""The runner process: `python -m harness.kernel.runner REQUEST.json RESULT.json`.

One fresh process per evaluation (as a fresh server per measurement): what a kernel module does at import dies
with it. For each shape, each build is checked (fresh inputs), the builds that pass are timed interleaved, then
checked again (fresh inputs). A kernel that fails to load, compile, check or time is recorded as such in the
result; the process exits non-zero only when the runner itself breaks.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import random
import sys
from pathlib import Path
from typing import Any

import torch

from harness.kernel.config import ShapeConfig
from harness.kernel.correctness import KernelFn, OutputGuard, call_kernel, check_kernel, make_inputs
from harness.kernel.loader import KernelLoadError, LoadedKernel, load_kernel
from harness.kernel.protocol import EvalRequest
from harness.kernel.reference import reference_attention
from harness.kernel.roofline import attainment, measure_roofline
from harness.kernel.timing import Timer, interleave, make_timer

__all__ = ["evaluate", "main"]


class _CallFailed(Exception):
    def __init__(self, tag: str, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {str(exc)[:600]}")
        self.tag = tag


def _tagged(tag: str, fn: KernelFn) -> KernelFn:
    """Name the build whose call raised during timing (the order of the builds alternates)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise _CallFailed(tag, exc) from exc

    return call


def describe_device(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"device": device.type, "torch": torch.__version__, "python": platform.python_version(),
                            "interpret": os.environ.get("TRITON_INTERPRET", "")}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, capability=f"{props.major}.{props.minor}", sm_count=props.multi_processor_count,
                    memory_bytes=props.total_memory, l2_bytes=getattr(props, "L2_cache_size", None),
                    cuda=torch.version.cuda)
    return info


def _shape(req: EvalRequest, shape: ShapeConfig, kernels: dict[str, LoadedKernel], timer: Timer,
           roofline: dict[str, Any] | None, rng: random.Random) -> dict[str, Any]:
    device, dtype = torch.device(req.device), getattr(torch, req.dtype)
    check = functools.partial(check_kernel, shape=shape, cfg=req.correctness, dtype=dtype, device=device)
    builds: dict[str, dict[str, Any]] = {}
    good: dict[str, LoadedKernel] = {}
    for tag, lk in kernels.items():
        pre = check(lk.fn, seed=rng.getrandbits(31))
        builds[tag] = {"pre": pre.as_json()}
        if pre.ok:
            good[tag] = lk
    if good:
        q, k, v = make_inputs(shape, dtype=dtype, device=device, seed=rng.getrandbits(31))
        out = torch.empty_like(q)
        fns = {tag: functools.partial(call_kernel, _tagged(tag, lk.fn), q, k, v, out, shape)
               for tag, lk in good.items()}
        guards = {tag: OutputGuard(out, rng) for tag in good}
        try:
            t = interleave(fns, timer, rounds=req.timing.rounds, calls_per_round=req.timing.calls_per_round,
                           warmup_calls=req.timing.warmup_calls, guards=guards)
        except _CallFailed as exc:
            builds[exc.tag]["timing_error"] = str(exc)
            good = {}
        else:
            ref = reference_attention(q, k, v, shape, dtype=getattr(torch, req.correctness.reference_dtype))
            for tag in good:
                wrong = guards[tag].verify(ref, req.correctness)
                builds[tag]["timed_outputs"] = {"checked": len(guards[tag].copies), "failures": wrong}
            for tag in good:
                median = t.median(tag)
                builds[tag].update(round_medians_us=t.round_medians[tag], median_us=median,
                                   timed_calls=len(t.calls[tag]),
                                   attainment=attainment(shape, median, roofline, itemsize=q.element_size()))
        del q, k, v, out
    for tag, lk in good.items():   # the second check: after hundreds of timed calls, on fresh inputs
        builds[tag]["post"] = check(lk.fn, seed=rng.getrandbits(31)).as_json()
    for entry in builds.values():
        entry["ok"] = bool(entry["pre"]["ok"] and entry.get("post", {}).get("ok") and "timing_error" not in entry
                           and not entry.get("timed_outputs", {}).get("failures"))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"mode": shape.mode, "shape": shape.model_dump(), "builds": builds}


def evaluate(req: EvalRequest) -> dict[str, Any]:
    device = torch.device(req.device)
    if device.type == "cpu":
        torch.set_num_threads(1)    # CPU time of one thread: no idle-spinning worker threads in the figures
    timer = make_timer(device, flush_l2=req.timing.flush_l2, hide_launch=req.timing.hide_launch_overhead)
    result: dict[str, Any] = {"device": describe_device(device), "roofline": None, "builds": {}, "shapes": {}}
    if req.roofline is not None and device.type == "cuda":
        result["roofline"] = measure_roofline(req.roofline, timer, device=device)
    kernels: dict[str, LoadedKernel] = {}
    for tag, tree in req.builds.items():
        try:
            lk = load_kernel(tree, req.module, req.entry, tag=tag)
        except KernelLoadError as exc:
            result["builds"][tag] = {"loaded": False, "error": str(exc)}
            continue
        kernels[tag] = lk
        result["builds"][tag] = {"loaded": True, "file": str(lk.file), "sha256": lk.sha256}
    rng = random.Random(req.seed)
    for shape in req.shapes:
        result["shapes"][shape.name] = _shape(req, shape, kernels, timer, result["roofline"], rng)
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m harness.kernel.runner REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    req = EvalRequest.model_validate_json(Path(args[0]).read_text())
    result = evaluate(req)
    out = Path(args[1])
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, allow_nan=False))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
