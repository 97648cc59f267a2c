"""Where an engine step goes: per step, kernel time by category, GPU busy vs idle, and the medians per phase.

Per step (harness/trace_steps.py cuts the steps), on a GPU host:
- wall: the step's start to the next step's start;
- GPU busy: the union (not the sum) of the kernels, copies and sets the step launched, on every stream;
- GPU idle: wall - busy, split into *launch gaps* (idle between the step's first and last device activity: the
  device waiting for the next launch or for the host mid-step) and *CPU time between GPU work* (wall minus that
  span: scheduling, input preparation, sampling read-back, output processing; what async scheduling hides);
- kernels in CUDA graphs: the kernel time CUPTI attributes to a graph replay (`graph id`), the check that
  graphs were on while profiled;
- host ops while GPU idle: the engine process's recorded host events (ops, runtime calls) in the step's window
  that no device activity overlaps (Python without ops is not recorded, so this is a lower bound);
- kernel time by category (harness/kernel_names.py), summed over kernels (two streams can overlap, so kernel
  rows may add up to more than busy), with two rows settled per step: *lm_head + softcap* (the GEMM whose CPU op
  has the vocabulary among its input dims when shapes are recorded, else the step's last GEMM; then the divide,
  tanh and multiply after it) and attention split into the model's layer types when one attention kernel shows
  two launch signatures (grid, block, shared memory, registers) whose counts match the sliding:full layer ratio.
On a CPU host (no device activity) the rows are the ops' self time by the same categories, and the rest of the
wall is host time outside ops. The table holds, per phase, the median over steps of each row (medians do not
add up to the median wall) and its share of the median wall.
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from harness.kernel_names import ATTENTION, CATEGORIES, GEMM, LM_HEAD, category_of, is_elementwise
from harness.roofline import ModelShape
from harness.trace_steps import Event, SplitTrace, Step, self_times, union_us

__all__ = ["ModelHints", "TableRow", "PhaseTable", "StepTable", "step_breakdowns", "step_table",
           "render_step_table", "WALL", "BUSY", "IDLE", "GRAPHED", "LAUNCH_GAPS", "CPU_BETWEEN", "HOST_EXPOSED",
           "HOST_OTHER", "UNSPLIT"]

WALL, BUSY, IDLE = "wall", "GPU busy", "GPU idle"
GRAPHED = "kernels in CUDA graphs"
LAUNCH_GAPS, CPU_BETWEEN = "launch gaps", "CPU time between GPU work"
HOST_EXPOSED, HOST_OTHER = "host ops while GPU idle", "host time outside ops"
UNSPLIT = "attention (not split)"
PHASES = ("decode", "prefill", "mixed", "unknown")


@dataclass(frozen=True)
class ModelHints:
    """What the per-step rules need of the served model: the vocabulary (lm_head's N) and its attention layer
    kinds as (label, layers, layers that store K/V)."""
    vocab: int | None = None
    attention: tuple[tuple[str, int, int], ...] = ()

    @classmethod
    def from_shape(cls, shape: ModelShape) -> ModelHints:
        kinds: dict[str, list[int]] = {}
        for layer in shape.layers:
            label = f"{'sliding' if layer.window else 'full'} (d{layer.head_dim})"
            counts = kinds.setdefault(label, [0, 0])
            counts[0] += 1
            counts[1] += int(layer.stores_kv)
        return cls(vocab=shape.vocab, attention=tuple((k, v[0], v[1]) for k, v in kinds.items()))


@dataclass(frozen=True)
class TableRow:
    name: str
    median_us: float
    share: float                  # of the phase's median wall


@dataclass(frozen=True)
class PhaseTable:
    phase: str
    steps: int
    requests: tuple[int, float, int] | None     # requests per step: min, median, max (from the step ranges)
    rows: tuple[TableRow, ...]


@dataclass(frozen=True)
class StepTable:
    source: str                   # how the steps were found
    device: str                   # "GPU" or "CPU (no device activity in the trace)"
    phases: tuple[PhaseTable, ...]
    notes: tuple[str, ...]


def step_breakdowns(split: SplitTrace, hints: ModelHints | None = None) -> tuple[list[dict[str, float]], Counter[str]]:
    """Per step, µs per row; and the notes the rules left (reason -> steps)."""
    notes: Counter[str] = Counter()
    if not split.has_device:
        selfs = {id(e): s for e, s in self_times(e for h in split.host for e in h if e.get("cat") == "cpu_op")}
        return [_cpu_step(step, host, selfs, hints, notes)
                for step, host in zip(split.steps, split.host, strict=True)], notes
    device = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in split.all_device)
    starts = [s for s, _ in device]
    longest = max((e - s for s, e in device), default=0.0)
    rows = []
    for step, kernels, host in zip(split.steps, split.device, split.host, strict=True):
        near = device[bisect.bisect_left(starts, step.start_us - longest):bisect.bisect_left(starts, step.end_us)]
        rows.append(_gpu_step(step, kernels, host, near, hints, notes))
    return rows, notes


def _cpu_step(step: Step, host: Sequence[Event], selfs: dict[int, float], hints: ModelHints | None,
              notes: Counter[str]) -> dict[str, float]:
    """Op self time by category, lm_head + softcap found as on a GPU."""
    ops = sorted((e for e in host if id(e) in selfs), key=lambda e: float(e["ts"]))
    label = {id(e): category_of(str(e.get("name", ""))) for e in ops}
    for e in _lm_head_and_softcap(ops, label, host, hints, notes):
        label[id(e)] = LM_HEAD
    rows: dict[str, float] = defaultdict(float)
    for e in ops:
        rows[label[id(e)]] += max(selfs[id(e)], 0.0)
    rows[HOST_OTHER] = max(step.wall_us - sum(rows.values()), 0.0)
    rows[WALL] = step.wall_us
    return rows


def _gpu_step(step: Step, kernels: Sequence[Event], host: Sequence[Event], near: list[tuple[float, float]],
              hints: ModelHints | None, notes: Counter[str]) -> dict[str, float]:
    rows: dict[str, float] = defaultdict(float)
    busy = _length(union_us((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in kernels))
    span = (max(float(e["ts"]) + float(e["dur"]) for e in kernels) - min(float(e["ts"]) for e in kernels)
            if kernels else 0.0)
    rows[WALL] = step.wall_us
    rows[BUSY] = busy
    rows[IDLE] = max(step.wall_us - busy, 0.0)
    rows[LAUNCH_GAPS] = span - busy
    rows[CPU_BETWEEN] = max(step.wall_us - span, 0.0)
    rows[HOST_EXPOSED] = _exposed(host, near, step.start_us, step.end_us)
    # kernel time replayed from CUDA graphs (CUPTI's graph id): the check that graphs ran while profiled
    rows[GRAPHED] = sum(float(e["dur"]) for e in kernels if (e.get("args") or {}).get("graph id"))
    for e, label in _labels(kernels, host, hints, notes):
        rows[label] += float(e["dur"])
    return rows


def _length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _exposed(host: Iterable[Event], device: list[tuple[float, float]], start: float, end: float) -> float:
    """Time in [start, end) covered by host events and by no device activity."""
    spans = union_us((max(float(e["ts"]), start), min(float(e["ts"]) + float(e["dur"]), end)) for e in host)
    covered = union_us((max(s, start), min(e, end)) for s, e in device)
    overlap, j = 0.0, 0
    for s, e in spans:
        while j < len(covered) and covered[j][1] <= s:
            j += 1
        k = j
        while k < len(covered) and covered[k][0] < e:
            overlap += min(e, covered[k][1]) - max(s, covered[k][0])
            k += 1
    return _length(spans) - overlap


def _labels(kernels: Sequence[Event], host: Sequence[Event], hints: ModelHints | None,
            notes: Counter[str]) -> list[tuple[Event, str]]:
    ordered = sorted(kernels, key=lambda e: float(e["ts"]))
    label = {id(e): category_of(str(e.get("name", ""))) for e in ordered}
    for e in _lm_head_and_softcap(ordered, label, host, hints, notes):
        label[id(e)] = LM_HEAD
    label.update(_attention_kinds([e for e in ordered if label[id(e)] == ATTENTION], hints, notes))
    return [(e, label[id(e)]) for e in ordered]


def _lm_head_and_softcap(ordered: list[Event], label: dict[int, str], host: Sequence[Event],
                         hints: ModelHints | None, notes: Counter[str]) -> list[Event]:
    gemms = [e for e in ordered if label[id(e)] == GEMM]
    if not gemms:
        return []
    head = _gemm_with_vocab(gemms, host, hints.vocab) if hints and hints.vocab else None
    if head is None:
        head = gemms[-1]
        notes["lm_head: the step's last GEMM (no CPU op with the vocabulary in its input dims: shapes not "
              "recorded, or no model shapes)"] += 1
    else:
        notes[f"lm_head: the GEMM whose op has N = {hints.vocab if hints else '?'} in its input dims"] += 1
    run = []
    for e in _next_on_stream(ordered, head)[:3]:
        if not is_elementwise(str(e.get("name", ""))):
            break
        run.append(e)
    tanh = [i for i, e in enumerate(run) if "tanh" in str(e.get("name", "")).lower()]
    if not tanh:
        return [head]
    last = tanh[-1]
    if last + 1 < len(run) and "mul" in str(run[last + 1].get("name", "")).lower():
        last += 1
    return [head, *run[:last + 1]]


def _next_on_stream(ordered: list[Event], head: Event) -> list[Event]:
    """What ran after `head` on its stream (CPU ops: its thread), one level deep: events nested in an earlier
    one (an op's own children) are skipped."""
    stream = (head.get("args") or {}).get("stream")
    out: list[Event] = []
    free_at = float(head["ts"]) + float(head["dur"])
    for e in ordered[ordered.index(head) + 1:]:
        if (e.get("args") or {}).get("stream") == stream and e.get("tid") == head.get("tid") \
                and float(e["ts"]) >= free_at:
            out.append(e)
            free_at = float(e["ts"]) + float(e["dur"])
    return out


def _gemm_with_vocab(gemms: list[Event], host: Sequence[Event], vocab: int) -> Event | None:
    """The last GEMM whose launching op has `vocab` among its input dims. A kernel names that op by its
    `External id`, or through its launch (the runtime call with the same correlation carries it)."""
    dims_by_ext: dict[object, object] = {}
    ext_by_corr: dict[object, object] = {}
    for e in host:
        args = e.get("args") or {}
        if e.get("cat") == "cpu_op" and "Input Dims" in args:
            dims_by_ext[args.get("External id")] = args["Input Dims"]
        elif "correlation" in args:
            ext_by_corr[args["correlation"]] = args.get("External id")
    for e in reversed(gemms):
        args = e.get("args") or {}
        dims = dims_by_ext.get(args.get("External id", ext_by_corr.get(args.get("correlation"))))
        if isinstance(dims, list) and any(isinstance(d, list) and vocab in d for d in dims):
            return e
    return None


def _attention_kinds(attention: list[Event], hints: ModelHints | None, notes: Counter[str]) -> dict[int, str]:
    """Attention kernels labelled by layer kind where one kernel name shows exactly two launch signatures whose
    counts match the model's sliding:full ratio (over all layers, or over the layers that store K/V for cache
    writes); every other attention kernel goes to the "not split" row, with the reason noted."""
    out: dict[int, str] = {}
    by_name: dict[str, list[Event]] = defaultdict(list)
    for e in attention:
        by_name[str(e.get("name", ""))].append(e)
    for name, events in by_name.items():
        kinds, reason = _match_kinds(events, hints)
        if kinds is None:
            notes[f"attention not split for {name[:60]}: {reason}"] += 1
        for e in events:
            out[id(e)] = f"attention {kinds[_signature(e)]}" if kinds else UNSPLIT
    return out


def _signature(e: Event) -> tuple[str, ...]:
    args = e.get("args") or {}
    return tuple(str(args.get(k)) for k in ("grid", "block", "shared memory", "registers per thread"))


def _match_kinds(events: list[Event], hints: ModelHints | None) -> tuple[dict[tuple[str, ...], str] | None, str]:
    if hints is None or len(hints.attention) != 2:
        return None, ("no model shapes to tell layer kinds apart" if hints is None or not hints.attention
                      else f"the model has {len(hints.attention)} attention layer kind(s)")
    groups: dict[tuple[str, ...], int] = Counter(_signature(e) for e in events)
    if len(groups) != 2:
        return None, f"{len(groups)} launch signature(s) in a step, not 2"
    (sig_a, a), (sig_b, b) = groups.items()
    (kind_x, *x), (kind_y, *y) = hints.attention
    for nx, ny in zip(x, y, strict=True):         # all layers, then the layers that store K/V
        if nx == ny:
            continue
        if a * ny == b * nx:
            return {sig_a: kind_x, sig_b: kind_y}, ""
        if b * ny == a * nx:
            return {sig_a: kind_y, sig_b: kind_x}, ""
    return None, f"launch counts {a}:{b} match no layer ratio of the model ({hints.attention})"


def step_table(split: SplitTrace, hints: ModelHints | None = None) -> StepTable:
    per_step, notes = step_breakdowns(split, hints)
    phases = []
    for phase in PHASES:
        chosen = [(s, r) for s, r in zip(split.steps, per_step, strict=True) if s.phase == phase]
        if chosen:
            phases.append(_phase_table(phase, chosen))
    extra = [f"{reason} ({n} steps)" for reason, n in sorted(notes.items())]
    return StepTable(source=split.source, device="GPU" if split.has_device else "CPU (no device activity in the "
                     "trace): rows are op self time", phases=tuple(phases), notes=tuple(split.notes) + tuple(extra))


def _row_order(rows: Iterable[str]) -> list[str]:
    present = set(rows)
    fixed = [WALL, BUSY, IDLE, GRAPHED]
    split = sorted(r for r in present if r.startswith("attention ") and r != UNSPLIT)
    kinds = [*split, UNSPLIT, *CATEGORIES]       # ATTENTION itself: a CPU host's row (ops are not split)
    tail = [LAUNCH_GAPS, CPU_BETWEEN, HOST_EXPOSED, HOST_OTHER]
    return [r for r in fixed + kinds + tail if r in present]


def _phase_table(phase: str, chosen: list[tuple[Step, dict[str, float]]]) -> PhaseTable:
    names = _row_order(name for _, rows in chosen for name in rows)
    medians = {n: statistics.median(rows.get(n, 0.0) for _, rows in chosen) for n in names}
    wall = medians.get(WALL) or 0.0
    requests = [s.generation[0] + s.context[0] for s, _ in chosen if s.generation and s.context]
    return PhaseTable(phase=phase, steps=len(chosen),
                      requests=(min(requests), statistics.median(requests), max(requests)) if requests else None,
                      rows=tuple(TableRow(name=n, median_us=medians[n], share=medians[n] / wall if wall else 0.0)
                                 for n in names))


def render_step_table(table: StepTable, *, title: str) -> list[str]:
    lines = [f"{title}: per engine step, median over steps ({table.device}; steps from {table.source})"]
    for phase in table.phases:
        batch = (f", requests per step {phase.requests[0]}..{phase.requests[2]} (median {phase.requests[1]:g})"
                 if phase.requests else "")
        lines.append(f"  {phase.phase}: {phase.steps} steps{batch}")
        lines += [f"    {row.name:<28} {row.median_us:10.1f} µs {row.share:7.1%}" for row in phase.rows]
    lines += [f"  note: {note}" for note in table.notes]
    return lines
