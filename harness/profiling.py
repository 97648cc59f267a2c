"""Where the time goes: vLLM's torch profiler around one prefill run and one decode-heavy run.

The server is started with `--profiler-config` (torch profiler, traces to a directory of its own sandbox);
the harness calls /start_profile and /stop_profile around a pristine benchmark run, copies the traces out
(Running.collect: regular files only, size-capped), then reads the Chrome traces two ways: ops (CPU) and
kernels (GPU) ranked by *self* time over the whole run, and the run cut into engine steps with a median step
per phase (decode, prefill, mixed): wall, GPU busy vs idle, kernel time by category, launch gaps and CPU time
between GPU work (harness/trace_steps.py, harness/step_profile.py). Both phases run at the grid's own shapes,
with the grid's prompts and concurrency: "prefill" = a run of (input_len, output 1), "end-to-end" = a run of the
cell itself (input_len, output_len), prefill and decode together as the benchmark sees them.

CUDA graphs stay as the server runs them: CUPTI records each kernel a graph replay runs (with its `graph id`
and `graph node id`, correlated with the `cudaGraphLaunch`), so kernel times come from the graph itself, not
from an eager stand-in; the profiler only needs its CUDA activity, which vLLM turns on by default on a GPU.
Shapes are recorded (`torch_profiler_record_shapes`) so the lm_head GEMM can be told by its N, the vocabulary.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import secrets
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from harness.bench import BenchJob, run_jobs
from harness.config import BenchmarkConfig, Cell, ServerConfig
from harness.errors import HarnessError, RooflineUnavailable
from harness.roofline import load_model_shape
from harness.server import serve
from harness.step_profile import ModelHints, StepTable, render_step_table, step_table
from harness.trace_steps import read_trace_files, split_steps
from sandbox.base import Backend

__all__ = ["OpTime", "Profile", "profile_cell", "read_profile", "model_hints", "top_ops", "read_traces",
           "render_profiles"]

_OP_CATEGORIES = {"cpu_op", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime"}


@dataclass(frozen=True)
class OpTime:
    name: str
    category: str
    self_ms: float
    calls: int
    share: float          # of all self time in the phase


@dataclass(frozen=True)
class Profile:
    phase: str            # "prefill" | "end-to-end"
    cell: Cell
    ops: tuple[OpTime, ...]
    trace_files: tuple[str, ...]
    steps: StepTable | None = None          # the median engine step per phase (None: see steps_note)
    steps_note: str = ""                    # why there is no step table


def read_traces(directory: Path) -> list[dict[str, object]]:
    events: list[dict[str, object]] = []
    for path in sorted(directory.rglob("*.json*")):
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt") as f:  # type: ignore[operator]
                data = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue
        events.extend(e for e in data.get("traceEvents", []) if isinstance(e, dict))
    return events


def top_ops(events: list[dict[str, object]], limit: int = 15) -> list[OpTime]:
    """Self time per op name: an event's duration minus the time of events nested inside it on the
    same thread (a Chrome trace only stores inclusive durations)."""
    by_thread: dict[tuple[object, object], list[dict[str, object]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in _OP_CATEGORIES and "dur" in e:
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    self_us: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))  # type: ignore[arg-type]
        stack: list[tuple[float, tuple[str, str]]] = []     # (end time, key)
        for e in thread_events:
            start, dur = float(e["ts"]), float(e["dur"])  # type: ignore[arg-type]
            key = (str(e.get("name")), str(e.get("cat")))
            while stack and stack[-1][0] <= start:
                stack.pop()
            if stack:
                self_us[stack[-1][1]] -= dur   # the parent's self time excludes this child
            self_us[key] += dur
            calls[key] += 1
            stack.append((start + dur, key))
    total = sum(v for v in self_us.values() if v > 0) or 1.0
    ranked = sorted(self_us.items(), key=lambda kv: -kv[1])[:limit]
    return [OpTime(name=k[0], category=k[1], self_ms=v / 1000, calls=calls[k], share=v / total) for k, v in ranked]


def profile_cell(backend: Backend, *, tree: Path, engine_args: dict[str, object], server: ServerConfig,
                 bench: BenchmarkConfig, cell: Cell, work_dir: Path, cache_dir: Path) -> list[Profile]:
    # The server writes its traces inside its own sandbox (/tmp there); the harness copies them out after each
    # phase (regular files only, size-capped): a candidate's server never writes into the log folder.
    inner = f"/tmp/ratchet-traces-{secrets.token_hex(4)}"
    # No summary table at stop (torch_profiler_dump_cuda_time_total): the harness reads the trace itself, and on a
    # GPU run of a million events building that table would hold /stop_profile for minutes.
    profiler = json.dumps({"profiler": "torch", "torch_profiler_dir": inner, "torch_profiler_with_stack": False,
                           "torch_profiler_use_gzip": True, "torch_profiler_record_shapes": True,
                           "torch_profiler_dump_cuda_time_total": False})
    hints, why = model_hints(server.model)
    # the grid's prompts and concurrency; a prefill run sends num_prompts, not the grid's multiple of it (the
    # profiler's overhead would make that run minutes long for no better ranking)
    small = bench.model_copy(update={"num_warmups": 1, "prefill_prompts_factor": 1})
    phases = (("prefill", Cell(input_len=cell.input_len, output_len=1)),
              ("end-to-end", Cell(input_len=cell.input_len, output_len=cell.output_len)))
    profiles = []
    with serve(backend, tree=tree, config=server, engine_args=engine_args, log_path=work_dir / "server.log",
               cache_dir=cache_dir, extra_argv=("--profiler-config", profiler)) as srv:
        seen: set[str] = set()
        for phase, phase_cell in phases:
            job = BenchJob(cell=phase_cell, base_url=srv.base_url, model_name=srv.model_name,
                           tokenizer=server.model, tag=phase, repeat=0)
            run_jobs([job], small, work_dir=work_dir / f"warm-{phase}")     # compile/warm outside the trace
            with httpx.Client(timeout=300) as client:
                client.post(f"{srv.base_url}/start_profile").raise_for_status()
                run_jobs([job], small, work_dir=work_dir / f"bench-{phase}")
                client.post(f"{srv.base_url}/stop_profile").raise_for_status()
            phase_dir = work_dir / f"trace-{phase}"
            new = _wait_for_new_traces(lambda d: srv.running.collect(inner, d), work_dir / f"collect-{phase}", seen)
            phase_dir.mkdir(parents=True, exist_ok=True)
            for path in new:
                path.rename(phase_dir / path.name)
            profiles.append(read_profile(phase, phase_cell, phase_dir, hints, why=why))
    with contextlib.suppress(OSError):   # unisolated, the server's /tmp is the host's
        shutil.rmtree(inner)
    return profiles


def model_hints(model: Path) -> tuple[ModelHints | None, str]:
    """The vocabulary and attention layer kinds of the served model, or why they are unknown (the step table
    then finds lm_head by position and does not split attention)."""
    try:
        return ModelHints.from_shape(load_model_shape(model)), ""
    except RooflineUnavailable as exc:
        return None, str(exc)


def read_profile(phase: str, cell: Cell, phase_dir: Path, hints: ModelHints | None, *, why: str = "") -> Profile:
    """Top ops and the step table of one phase's trace folder. A trace that cannot be cut into steps keeps its
    top ops; the reason takes the step table's place."""
    ops = top_ops(read_traces(phase_dir))
    files = tuple(str(p) for p in sorted(phase_dir.iterdir()))
    try:
        table = step_table(split_steps(read_trace_files(phase_dir)), hints)
    except HarnessError as exc:
        return Profile(phase=phase, cell=cell, ops=tuple(ops), trace_files=files, steps_note=str(exc))
    if why:
        table = replace(table, notes=(*table.notes, f"no model shapes: {why}"))
    return Profile(phase=phase, cell=cell, ops=tuple(ops), trace_files=files, steps=table)


def _wait_for_new_traces(collect: Callable[[Path], list[Path]], scratch: Path, seen: set[str],
                         timeout_s: float = 120.0) -> list[Path]:
    """Traces are written asynchronously after /stop_profile: collect until new files appear and stop
    growing; `seen` holds the names of earlier phases' files."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, int] = {}
    while time.monotonic() < deadline:
        if scratch.exists():
            shutil.rmtree(scratch)
        files = [p for p in collect(scratch) if p.name not in seen]
        sizes = {p.name: p.stat().st_size for p in files}
        if files and sizes == last:
            seen.update(sizes)
            return files
        last = sizes
        time.sleep(1.0)
    raise HarnessError(f"no profiler trace appeared in the server's sandbox within {timeout_s:.0f} s; read the "
                       "server log")


def render_profiles(profiles: list[Profile]) -> str:
    """Plain text for proposers and the log: the step tables first (a proposer's prompt keeps the first few
    thousand characters), then the top ops per phase as before."""
    lines = []
    for prof in profiles:
        if prof.steps is not None:
            lines += render_step_table(prof.steps, title=f"{prof.phase} run ({prof.cell.label})")
        elif prof.steps_note:
            lines.append(f"{prof.phase} run ({prof.cell.label}): no step table: {prof.steps_note}")
    for prof in profiles:
        lines.append(f"{prof.phase} ({prof.cell.label}): top ops by self time")
        lines += [f"  {op.share:6.1%} {op.self_ms:9.1f} ms {op.calls:7d}x  [{op.category}] {op.name[:90]}"
                  for op in prof.ops]
    return "\n".join(lines)
