"""The runner process: `python -m harness.kernel.runner REQUEST.json RESULT.json`.

One fresh process per evaluation (as a fresh server per measurement), and in it one worker process per build
(`--worker REQUEST.json TAG`): a build's kernel module is imported only in its own worker, so what it does at
import (a patched torch function, a rebound class) can touch neither the other build nor the timing of it.
The orchestrator holds no kernel code; it drives the workers over JSON lines. For each shape, each build is
checked (fresh inputs), the builds that pass are timed interleaved round by round on identical inputs, the
timed calls' own outputs are checked (re-poisoned before every call, one call per round kept), then every
build is checked again (fresh inputs). A kernel that fails to load, compile, check or time is recorded as such
in the result; the process exits non-zero only when the runner itself breaks.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness.kernel.config import ShapeConfig
from harness.kernel.correctness import OutputGuard, check_kernel, make_inputs
from harness.kernel.interfaces import bind, read_backend_constants
from harness.kernel.loader import KernelLoadError, load_kernel
from harness.kernel.protocol import EvalRequest
from harness.kernel.reference import reference_attention
from harness.kernel.roofline import attainment, measure_roofline
from harness.kernel.timing import make_timer

__all__ = ["evaluate", "main"]


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


class _Worker:
    """One build's process: it loads that build's kernel and only that one, and answers the orchestrator's
    commands (JSON lines) on its own stdin/stdout. Another build's kernel code never runs in it."""

    def __init__(self, request_path: Path, tag: str) -> None:
        self.tag = tag
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.kernel.runner", "--worker", str(request_path),
                                      tag], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.hello = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"build {self.tag}'s worker exited ({self.proc.wait()}); see the runner log")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):   # "exit" has no answer; a dead pipe is fine
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _shape(req: EvalRequest, index: int, shape: ShapeConfig, workers: dict[str, _Worker],
           roofline: dict[str, Any] | None, rng: random.Random) -> dict[str, Any]:
    """Check every build, time the builds that pass interleaved (round by round, alternating order, each in
    its own process on identical inputs), check the timed calls' outputs, check every build again."""
    builds: dict[str, dict[str, Any]] = {}
    good: list[str] = []
    for tag, worker in workers.items():
        pre = worker.ask(op="check", shape=index, seed=rng.getrandbits(31))
        builds[tag] = {"pre": pre}
        if pre["ok"]:
            good.append(tag)
    if good:
        inputs_seed, guard_seed = rng.getrandbits(31), rng.getrandbits(31)
        for tag in list(good):
            ready = workers[tag].ask(op="prepare", shape=index, seed=inputs_seed, guard_seed=guard_seed)
            if "error" in ready:      # e.g. a kernel that cannot be captured in a CUDA graph
                builds[tag]["timing_error"] = ready["error"]
                good.remove(tag)
            else:
                builds[tag]["timed_as"] = ready["timed_as"]
        for tag in good:
            workers[tag].ask(op="time", calls=req.timing.warmup_calls, guard=False)
        medians: dict[str, list[float]] = {tag: [] for tag in good}
        calls: dict[str, list[float]] = {tag: [] for tag in good}
        failed = None
        for r in range(req.timing.rounds):
            for tag in good if r % 2 == 0 else list(reversed(good)):
                answer = workers[tag].ask(op="time", calls=req.timing.calls_per_round, guard=True)
                if "error" in answer:
                    failed = tag
                    builds[tag]["timing_error"] = answer["error"]
                    break
                medians[tag].append(statistics.median(answer["times"]))
                calls[tag].extend(answer["times"])
            if failed:
                break
        if failed:
            good = []
        else:
            for tag in good:
                verdict = workers[tag].ask(op="verify")
                median = statistics.median(calls[tag])
                builds[tag].update(round_medians_us=medians[tag], median_us=median, timed_calls=len(calls[tag]),
                                   timed_outputs=verdict,
                                   attainment=attainment(shape, median, roofline,
                                                         itemsize=getattr(torch, req.dtype).itemsize))
    for tag in good:   # the second check: after hundreds of timed calls, on fresh inputs
        builds[tag]["post"] = workers[tag].ask(op="check", shape=index, seed=rng.getrandbits(31))
    for entry in builds.values():
        entry["ok"] = bool(entry["pre"]["ok"] and entry.get("post", {}).get("ok") and "timing_error" not in entry
                           and not entry.get("timed_outputs", {}).get("failures"))
    return {"mode": shape.mode, "shape": shape.model_dump(), "builds": builds}


def evaluate(req: EvalRequest, *, work_dir: Path | None = None) -> dict[str, Any]:
    """Orchestrate one evaluation: a worker process per build (started together, so they time the same
    machine state), the shapes in order; the result has the same form whatever the number of builds."""
    device = torch.device(req.device)
    result: dict[str, Any] = {"device": describe_device(device), "roofline": None, "builds": {}, "shapes": {}}
    with tempfile.TemporaryDirectory(prefix="ratchet-kernel-", dir=work_dir) as tmp:
        request_path = Path(tmp) / "request.json"
        request_path.write_text(req.model_dump_json())
        workers: dict[str, _Worker] = {}
        try:
            for tag in req.builds:
                worker = _Worker(request_path, tag)
                result["builds"][tag] = worker.hello
                if worker.hello.get("loaded"):
                    workers[tag] = worker
                else:
                    worker.close()
            if req.roofline is not None and device.type == "cuda" and workers:
                result["roofline"] = next(iter(workers.values())).ask(op="roofline")["roofline"]
            rng = random.Random(req.seed)
            for index, shape in enumerate(req.shapes):
                result["shapes"][shape.name] = _shape(req, index, shape, workers, result["roofline"], rng)
        finally:
            for worker in workers.values():
                worker.close()
    return result


def capture_graph(run: Callable[[], object], device: torch.device) -> Callable[[], object]:
    """The call captured in a CUDA graph (after warm-up calls on a side stream, which also compile Triton
    kernels); returns the graph's replay. Its inputs and output are the tensors the call was bound to."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            run()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


def _serve_build(req: EvalRequest, tag: str) -> int:
    """The worker: load one build, then answer commands until "exit". Anything the kernel prints goes to
    stderr (the runner log); the protocol has stdout to itself."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    device, dtype = torch.device(req.device), getattr(torch, req.dtype)
    if device.type == "cpu":
        torch.set_num_threads(1)    # CPU time of one thread: no idle-spinning worker threads in the figures
    timer = make_timer(device, flush_l2=req.timing.flush_l2, hide_launch=req.timing.hide_launch_overhead)

    def say(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj, allow_nan=False) + "\n")

    vllm = req.interface == "vllm-unified-attention"
    try:
        backend = read_backend_constants(req.builds[tag]) if vllm else None
        lk = load_kernel(req.builds[tag], req.module, req.entry, tag=tag, as_package=vllm)
    except (KernelLoadError, OSError, ValueError, SyntaxError) as exc:
        say({"loaded": False, "error": str(exc)})
        return 0
    say({"loaded": True, "file": str(lk.file), "sha256": lk.sha256, "interface": req.interface,
         **({"backend": vars(backend)} if backend else {})})
    state: dict[str, Any] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "exit":
            return 0
        if op == "check":
            shape = req.shapes[cmd["shape"]]
            say(check_kernel(lk.fn, shape, req.correctness, dtype=dtype, device=device, seed=cmd["seed"],
                             interface=req.interface, backend=backend).as_json())
        elif op == "prepare":
            shape = req.shapes[cmd["shape"]]
            q, k, v = make_inputs(shape, dtype=dtype, device=device, seed=cmd["seed"])
            out = torch.empty_like(q)
            call = bind(req.interface, lk.fn, q, k, v, out, shape, seed=cmd["seed"], backend=backend)
            graphed = device.type == "cuda" and (req.timing.cuda_graph == "always" or (
                req.timing.cuda_graph == "decode" and shape.q_len == 1))
            try:
                fn = capture_graph(call.run, device) if graphed else call.run
            except Exception as exc:  # recorded as this build's timing error; the worker stays up
                say({"error": f"capturing a CUDA graph of the call failed: {type(exc).__name__}: {str(exc)[:600]}"})
                continue
            state = {"shape": shape, "q": q, "k": k, "v": v, "out": out, "call": call, "fn": fn,
                     "guard": OutputGuard(out, random.Random(cmd["guard_seed"]))}
            say({"ok": True, "timed_as": "cuda-graph replay" if graphed else "calls"})
        elif op == "time":
            guard: OutputGuard = state["guard"]
            try:
                if cmd["guard"]:
                    guard.arm(cmd["calls"])
                    times = timer.time_calls(state["fn"], cmd["calls"], before=guard.before, after=guard.after)
                else:
                    times = timer.time_calls(state["fn"], cmd["calls"])
            except Exception as exc:  # the kernel raised while timed: recorded, the worker stays up
                say({"error": f"{type(exc).__name__}: {str(exc)[:600]}"})
                continue
            say({"times": times})
        elif op == "verify":
            ref = reference_attention(state["q"], state["k"], state["v"], state["shape"],
                                      dtype=getattr(torch, req.correctness.reference_dtype))
            say({"checked": len(state["guard"].copies), "failures": state["guard"].verify(ref, req.correctness)})
            state = {}
            if device.type == "cuda":
                torch.cuda.empty_cache()
        elif op == "roofline":
            assert req.roofline is not None
            say({"roofline": measure_roofline(req.roofline, timer, device=device)})
        else:
            say({"error": f"unknown op {op!r}"})
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "--worker":
        return _serve_build(EvalRequest.model_validate_json(Path(args[1]).read_text()), args[2])
    if len(args) != 2:
        print("usage: python -m harness.kernel.runner REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    req = EvalRequest.model_validate_json(Path(args[0]).read_text())
    result = evaluate(req, work_dir=Path(args[1]).parent)
    out = Path(args[1])
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, allow_nan=False))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
