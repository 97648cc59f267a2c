"""A vLLM server's torch profiler trace, cut into engine steps: pure functions over Chrome trace events.

How a step is found. vLLM's GPU worker (and the CPU worker, which inherits it) wraps every `execute_model` in a
`record_function` named after the step's shape while the torch profiler runs (vllm/v1/worker/gpu_worker.py,
`annotate_profile`): `execute_context_{C}({c})_generation_{G}({g})`, or with `detailed_trace_annotation`
`execute_{T}_context_{C}(sq{c}sk…)_generation_{G}(sq{g}sk…)`, where C requests with no output yet (prefill,
including a later chunk of a chunked prefill) carry c tokens and G generating requests carry g. Those ranges
(`user_annotation` events on the worker's CPU thread) are the steps: a step runs from its range's start to the
next range's start, so sampling, the output sent to the front end and the scheduling of the next step count in
it. A trace without them (another engine, an older vLLM) is cut where the device is idle for `gap_us` or more,
and the table says so; with async scheduling those gaps can vanish, so such a split is a fallback only.

Which step a kernel belongs to: the step during which the CPU launched it (the kernel's `correlation` id leads
to its `cudaLaunchKernel` / `cudaGraphLaunch` runtime event), not the step during which it ran: with async
scheduling the CPU is already preparing step n+1 while the device still runs step n. Kernels replayed from a
CUDA graph are recorded one by one by CUPTI (each with a `graph id` and `graph node id` and the correlation id
of the `cudaGraphLaunch`), so a graph's kernels land in the step that replayed it.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import TraceUnusable

__all__ = ["DEVICE_CATEGORIES", "HOST_CATEGORIES", "Event", "TraceFile", "Step", "SplitTrace", "read_trace_files",
           "split_steps", "self_times", "union_us", "STEP_RANGE"]

Event = dict[str, Any]
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
HOST_CATEGORIES = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function"})
_LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
STEP_RANGE = re.compile(r"^execute_(?:\d+_)?context_(\d+)\((?:sq)?(\d+)[^)]*\)_generation_(\d+)\((?:sq)?(\d+)")


@dataclass(frozen=True)
class TraceFile:
    name: str
    events: tuple[Event, ...]     # complete ("X") events, `ts` moved onto the first file's time base


@dataclass(frozen=True)
class Step:
    index: int
    start_us: float
    end_us: float                 # the next step's start; the last step's own end
    phase: str                    # "decode" | "prefill" | "mixed" | "unknown" (no step ranges, kernels unclear)
    context: tuple[int, int] | None = None      # (requests, tokens) still in prefill, from the step range
    generation: tuple[int, int] | None = None   # (requests, tokens) generating

    @property
    def wall_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class SplitTrace:
    source: str                   # how the steps were found, in words
    file: str                     # the trace file of the engine process
    steps: tuple[Step, ...]
    device: tuple[tuple[Event, ...], ...]    # per step: the device activity it launched
    host: tuple[tuple[Event, ...], ...]      # per step: the engine process's host events that started in it
    all_device: tuple[Event, ...] = ()       # every device activity, for overlap with host time
    notes: tuple[str, ...] = field(default=())

    @property
    def has_device(self) -> bool:
        return bool(self.all_device)


def read_trace_files(directory: Path) -> list[TraceFile]:
    """Every Chrome trace under `directory` (gzip or not), one per process. Kineto writes `ts` relative to the
    file's `baseTimeNanoseconds`; files with another base are shifted onto the first one's."""
    files: list[TraceFile] = []
    base0: float | None = None
    for path in sorted(directory.rglob("*.json*")):
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt") as f:
                data = json.load(f)
        except (OSError, EOFError, json.JSONDecodeError):
            continue
        if not isinstance(data, dict):
            continue
        base = float(data.get("baseTimeNanoseconds") or 0)
        base0 = base if base0 is None else base0
        shift = (base - base0) / 1000.0
        events = tuple((e if not shift else {**e, "ts": float(e["ts"]) + shift}) for e in data.get("traceEvents", [])
                       if isinstance(e, dict) and e.get("ph") == "X" and _is_number(e.get("ts"))
                       and _is_number(e.get("dur")))    # a copy only where shifted: GPU traces hold ~1M events
        files.append(TraceFile(name=path.name, events=events))
    return files


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def split_steps(files: Iterable[TraceFile], *, gap_us: float = 100.0) -> SplitTrace:
    """The engine process's steps and what each launched. Refused (`TraceUnusable`) when no file holds step
    ranges or device activity: there is nothing to cut."""
    files = list(files)
    if not files:
        raise TraceUnusable("no readable Chrome trace (*.json, *.json.gz) in the profile's trace folder; the "
                            "server wrote none, or they were cut off: read the server log")
    ranged = [(f, _step_ranges(f.events)) for f in files]
    with_ranges = [(f, r) for f, r in ranged if r]
    if with_ranges:
        file, ranges = with_ranges[0]
        notes = (f"{len(with_ranges)} trace files hold step ranges; the first ({file.name}) is read",) \
            if len(with_ranges) > 1 else ()
        return _by_ranges(file, ranges, notes)
    devices = [(f, sum(e.get("cat") in DEVICE_CATEGORIES for e in f.events)) for f in files]
    file, count = max(devices, key=lambda fc: fc[1])
    if count == 0:
        names = ", ".join(f.name for f in files[:4])
        raise TraceUnusable(f"no engine step ranges (execute_context_…) and no device activity in {names}: "
                            "nothing to cut into steps; profile with the torch profiler's CPU and CUDA activities "
                            "on (vLLM's --profiler-config)")
    return _by_device_gaps(file, gap_us)


def _step_ranges(events: Iterable[Event]) -> list[tuple[Event, re.Match[str]]]:
    found = [(e, m) for e in events if e.get("cat") == "user_annotation"
             and (m := STEP_RANGE.match(str(e.get("name", "")))) is not None]
    return sorted(found, key=lambda em: float(em[0]["ts"]))


def _phase(context_requests: int, generation_requests: int) -> str:
    if context_requests and generation_requests:
        return "mixed"
    return "prefill" if context_requests else "decode" if generation_requests else "unknown"


def _by_ranges(file: TraceFile, found: list[tuple[Event, re.Match[str]]], notes: tuple[str, ...]) -> SplitTrace:
    # A range with nothing scheduled (the engine looped while a batch was in flight, or ran dry) is no step: its
    # time stays with the step before it, and after the last real step it is left out.
    ranges = [(e, m) for e, m in found if int(m.group(2)) + int(m.group(4)) > 0]
    if not ranges:
        raise TraceUnusable(f"{file.name}: its {len(found)} step ranges all have nothing scheduled; profile while "
                            "the benchmark runs")
    if len(ranges) < len(found):
        notes += (f"{len(found) - len(ranges)} step ranges with nothing scheduled are folded into the step before "
                  "them",)
    pid = ranges[0][0].get("pid")
    starts = [float(e["ts"]) for e, _ in ranges]
    device = [e for e in file.events if e.get("cat") in DEVICE_CATEGORIES]
    launched = _launch_times(file.events)
    per_step: list[list[Event]] = [[] for _ in ranges]
    early = 0
    for e in device:
        i = bisect.bisect_right(starts, launched.get(_correlation(e), float(e["ts"]))) - 1
        if i < 0:
            early += 1
        else:
            per_step[i].append(e)
    steps = []
    for i, (e, m) in enumerate(ranges):
        end = starts[i + 1] if i + 1 < len(ranges) else max(
            [float(e["ts"]) + float(e["dur"])] + [float(d["ts"]) + float(d["dur"]) for d in per_step[i]])
        c_req, c_tok, g_req, g_tok = (int(x) for x in m.groups())
        steps.append(Step(index=i, start_us=starts[i], end_us=end, phase=_phase(c_req, g_req),
                          context=(c_req, c_tok), generation=(g_req, g_tok)))
    step_ids = {id(e) for e, _ in found}
    host = [e for e in file.events if e.get("pid") == pid and e.get("cat") in HOST_CATEGORIES
            and id(e) not in step_ids]
    extra = (f"{early} device activities launched before the first step range are left out",) if early else ()
    return SplitTrace(source="vLLM's step ranges (execute_context_…_generation_…)", file=file.name,
                      steps=tuple(steps), device=tuple(tuple(d) for d in per_step),
                      host=_host_by_step(host, starts), all_device=tuple(device), notes=notes + extra)


def _correlation(e: Event) -> object:
    args = e.get("args") or {}
    return args.get("correlation") if isinstance(args, dict) else None


def _launch_times(events: Iterable[Event]) -> dict[object, float]:
    """correlation id -> when the CPU launched it (cudaLaunchKernel, cudaGraphLaunch, cudaMemcpyAsync, ...)."""
    out: dict[object, float] = {}
    for e in events:
        if e.get("cat") in _LAUNCH_CATEGORIES and (corr := _correlation(e)) is not None:
            out[corr] = float(e["ts"])
    return out


def _host_by_step(host: list[Event], starts: list[float]) -> tuple[tuple[Event, ...], ...]:
    per_step: list[list[Event]] = [[] for _ in starts]
    for e in host:
        i = bisect.bisect_right(starts, float(e["ts"])) - 1
        if i >= 0:
            per_step[i].append(e)
    return tuple(tuple(h) for h in per_step)


def _by_device_gaps(file: TraceFile, gap_us: float) -> SplitTrace:
    device = sorted((e for e in file.events if e.get("cat") in DEVICE_CATEGORIES), key=lambda e: float(e["ts"]))
    groups: list[list[Event]] = [[]]
    busy_until = float(device[0]["ts"])
    for e in device:
        if groups[-1] and float(e["ts"]) - busy_until >= gap_us:
            groups.append([])
        groups[-1].append(e)
        busy_until = max(busy_until, float(e["ts"]) + float(e["dur"]))
    starts = [float(g[0]["ts"]) for g in groups]
    steps = []
    for i, g in enumerate(groups):
        end = starts[i + 1] if i + 1 < len(groups) else max(float(e["ts"]) + float(e["dur"]) for e in g)
        steps.append(Step(index=i, start_us=starts[i], end_us=end, phase=_phase_from_kernels(g)))
    host = [e for e in file.events if e.get("cat") in HOST_CATEGORIES]
    return SplitTrace(source=f"device idle gaps of {gap_us:.0f} µs or more (the trace has no step ranges)",
                      file=file.name, steps=tuple(steps), device=tuple(tuple(g) for g in groups),
                      host=_host_by_step(host, starts), all_device=tuple(device),
                      notes=("phases guessed from kernel names (decode / prefill attention, Triton's 3D decode "
                             "kernel) or, failing that, from full CUDA-graph replays of attention",))


def _phase_from_kernels(kernels: list[Event]) -> str:
    names = " ".join(str(e.get("name", "")) for e in kernels).lower()
    decode = "decode" in names or "unified_attention_3d" in names
    prefill = "prefill" in names
    if decode or prefill:
        return "mixed" if decode and prefill else "decode" if decode else "prefill"
    attention = [e for e in kernels if "attention" in str(e.get("name", "")).lower()]
    if attention and all((e.get("args") or {}).get("graph id") for e in attention):
        return "decode"          # vLLM replays full CUDA graphs for uniform decode batches
    return "unknown"


def self_times(events: Iterable[Event]) -> list[tuple[Event, float]]:
    """Each op with its self time: its duration minus that of the ops nested in it on the same thread."""
    by_thread: dict[tuple[object, object], list[Event]] = defaultdict(list)
    for e in events:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    out: list[tuple[Event, float]] = []
    for thread in by_thread.values():
        thread.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        selfs = [float(e["dur"]) for e in thread]
        stack: list[int] = []
        for i, e in enumerate(thread):
            while stack and float(thread[stack[-1]]["ts"]) + float(thread[stack[-1]]["dur"]) <= float(e["ts"]):
                stack.pop()
            if stack:
                selfs[stack[-1]] -= float(e["dur"])
            stack.append(i)
        out += list(zip(thread, selfs, strict=True))
    return out


def union_us(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of [start, end) intervals, merged and sorted."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
