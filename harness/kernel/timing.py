"""Timing kernels: device events around each call, warm-up first, the L2 flushed before every call, many
calls, medians; several builds interleaved round by round with alternating order.

The flush reads a buffer twice the L2's size rather than writing it: a write leaves the L2 full of dirty lines,
and a kernel that reads less than the L2 holds then pays for writing them back. Seen on an H200: vLLM's sliding-
window decode at 64 sequences (33.5 MB of keys and values) took 23.9 us after a zeroing flush and 20.3 us after a
reading one; its 537 MB full-attention twin, 142 vs 135 us.

Launch overhead: a spin kernel (about 0.2 ms) is queued after the flush and before the start event, so the GPU is
still busy while the host runs the entry function and launches its kernels; the events then time device work
only, as in vLLM, which replays decode steps as CUDA graphs. Without it, host time leaks into the figure whenever
the GPU waits for a launch: seen on the H200 as the same decode kernel at 43 us in one runner process and 95-105
us in the next (and +60 us on a 140 us one), both builds of a process moving together.

The event class is bound when this module is imported, before any kernel module is loaded, so a kernel that
rebinds `torch.cuda.Event` at import cannot change how it is timed (its patches are also refused by the
policy's content rules). On the CPU (tests, the Triton interpreter) the process's CPU time stands in: CPU ops
are synchronous, and time the scheduler gives other processes (a loaded CI machine) is not counted.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

__all__ = ["Timer", "CudaTimer", "HostTimer", "WallTimer", "Timings", "Guard", "make_timer", "interleave", "evict"]

_EVENT = torch.cuda.Event
_SYNC = torch.cuda.synchronize
_SPIN = getattr(torch.cuda, "_sleep", None)     # a kernel that spins for N cycles (private, long-standing)
SPIN_CYCLES = 400_000                           # ~0.2 ms at the H200's 1.98 GHz: longer than the host's launch work

Call = Callable[[], object]
Hook = Callable[[int], object]


def _nothing(_: int) -> None:
    return None


class Timer:
    """Times `calls` calls of `fn`; returns microseconds per call. `before(i)` runs before call i's timed
    region (ahead of the L2 flush, so the cache state is the flush's), `after(i)` after it: the output guard
    re-poisons the output and keeps a copy of one call's result there, untimed."""

    def time_calls(self, fn: Call, calls: int, *, before: Hook = _nothing, after: Hook = _nothing) -> list[float]:
        raise NotImplementedError


@dataclass
class CudaTimer(Timer):
    device: torch.device
    flush: torch.Tensor | None      # a buffer larger than the L2: reading it evicts the kernel's data
    spin_cycles: int = 0            # GPU clock cycles of the spin kernel before each start event (0: none)

    def time_calls(self, fn: Call, calls: int, *, before: Hook = _nothing, after: Hook = _nothing) -> list[float]:
        starts = [_EVENT(enable_timing=True) for _ in range(calls)]   # type: ignore[no-untyped-call]
        ends = [_EVENT(enable_timing=True) for _ in range(calls)]     # type: ignore[no-untyped-call]
        for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
            before(i)
            if self.flush is not None:
                evict(self.flush)       # in the stream before the start event: outside the timed region
            if self.spin_cycles and _SPIN is not None:
                _SPIN(self.spin_cycles)   # keeps the GPU busy while the host launches what fn() enqueues
            start.record()
            fn()
            end.record()
            after(i)
        _SYNC(self.device)
        return [start.elapsed_time(end) * 1000.0 for start, end in zip(starts, ends, strict=True)]


def evict(flush: torch.Tensor) -> torch.Tensor:
    """Read all of `flush` (a reduction; nothing is written but one number), so the cache holds its clean lines."""
    return flush.view(torch.int32).sum(dtype=torch.int64)


class HostTimer(Timer):
    def time_calls(self, fn: Call, calls: int, *, before: Hook = _nothing, after: Hook = _nothing) -> list[float]:
        out = []
        for i in range(calls):
            before(i)
            t0 = time.process_time()
            fn()
            out.append((time.process_time() - t0) * 1e6)
            after(i)
        return out


class WallTimer(Timer):
    """Wall-clock time per call: a CPU product spread over threads (the served roofline's CPU ceilings) takes
    less wall time than the CPU time its threads add up to."""

    def time_calls(self, fn: Call, calls: int, *, before: Hook = _nothing, after: Hook = _nothing) -> list[float]:
        out = []
        for i in range(calls):
            before(i)
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
            after(i)
        return out


def make_timer(device: torch.device, *, flush_l2: bool, hide_launch: bool = True) -> Timer:
    if device.type != "cuda":
        return HostTimer()
    flush = None
    if flush_l2:
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 << 20)
        flush = torch.zeros(2 * l2, dtype=torch.uint8, device=device)
    if hide_launch and _SPIN is None:
        raise RuntimeError("torch.cuda._sleep is missing: set timing.hide_launch_overhead: false")
    return CudaTimer(device=device, flush=flush, spin_cycles=SPIN_CYCLES if hide_launch else 0)


@dataclass(frozen=True)
class Timings:
    round_medians: dict[str, list[float]]   # tag -> one median per round (the paired samples of the A/B)
    calls: dict[str, list[float]]           # tag -> every timed call (the reported median is over these)

    def median(self, tag: str) -> float:
        return statistics.median(self.calls[tag])


class Guard:
    """What runs around each timed call of one build: nothing by default."""

    def arm(self, calls: int) -> None:
        return None

    def before(self, i: int) -> None:
        return None

    def after(self, i: int) -> None:
        return None


def interleave(fns: Mapping[str, Call], timer: Timer, *, rounds: int, calls_per_round: int,
               warmup_calls: int, guards: Mapping[str, Guard] | None = None) -> Timings:
    """Warm each build up, then `rounds` rounds of `calls_per_round` calls per build; the order of the builds
    reverses every round (A B, B A, ...) so that neither always runs right after the other. A build's guard
    is armed before each of its rounds and hooked around each timed call."""
    tags = list(fns)
    for tag in tags:
        timer.time_calls(fns[tag], warmup_calls)
    medians: dict[str, list[float]] = {tag: [] for tag in tags}
    calls: dict[str, list[float]] = {tag: [] for tag in tags}
    for r in range(rounds):
        for tag in tags if r % 2 == 0 else reversed(tags):
            guard = (guards or {}).get(tag, Guard())
            guard.arm(calls_per_round)
            times = timer.time_calls(fns[tag], calls_per_round, before=guard.before, after=guard.after)
            medians[tag].append(statistics.median(times))
            calls[tag].extend(times)
    return Timings(round_medians=medians, calls=calls)
