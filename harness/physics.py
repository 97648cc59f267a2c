"""The served roofline applied (harness/roofline.py counts the work, harness/ceilings.py gives the ceilings): a
cell's floor time and what a measurement reached of it, the roofline columns of a grid's rows, the figures the
accept rule quarantines on (harness/stats.py `Physical`), and a published claim's verdict. Pure functions.

- floor: max(min_flops / matmul rate, bytes beyond the caches / bandwidth), at the median ceilings (`floor_s`) and
  at the fastest samples (`floor_best_s`: a run faster than this is impossible on the host);
- MFU: FLOPs as vLLM serves by default / measured seconds / matmul rate; MBU: bytes / seconds / bandwidth;
- roofline: floor_s / measured seconds (1.0: at the roofline).

A cell's measured seconds come from its headline throughput: prefill cells N x input / prefill tok/s, the others
N x (input + output) / total tok/s, N the requests of one run (`BenchmarkConfig.prompts_for`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.ceilings import Ceilings
from harness.config import BenchmarkConfig, Cell
from harness.errors import RooflineUnavailable
from harness.roofline import ModelShape, Work, Workload, cell_work, dtype_bytes, load_model_shape
from harness.stats import Physical

__all__ = ["Attainment", "ServedModel", "ClaimVerdict", "attain", "floor_seconds", "served_model", "workload_of",
           "measured_seconds", "cell_roofline", "roofline_rows", "physics_of", "judge_claim", "claim_seconds",
           "PLAUSIBLE", "CLAIM_METRICS"]


@dataclass(frozen=True)
class Attainment:
    floor_s: float          # the least time at the median ceilings
    floor_best_s: float     # at the fastest samples: faster than this is impossible
    bound: str              # what sets the floor: "compute" or "memory"
    measured_s: float
    mfu: float              # FLOPs as served / measured seconds / matmul rate
    mbu: float              # bytes / measured seconds / bandwidth

    @property
    def roofline(self) -> float:
        return self.floor_s / self.measured_s

    @property
    def impossible(self) -> bool:
        return self.measured_s < self.floor_best_s

    def to_json(self) -> dict[str, Any]:
        return {"floor_s": self.floor_s, "floor_best_s": self.floor_best_s, "bound": self.bound,
                "measured_s": self.measured_s, "mfu": self.mfu, "mbu": self.mbu, "roofline": self.roofline,
                "impossible": self.impossible}


def floor_seconds(work: Work, ceilings: Ceilings, *, best: bool = False) -> tuple[float, str]:
    flop_s = ceilings.flop_s_best if best else ceilings.flop_s
    bytes_s = ceilings.bytes_s_best if best else ceilings.bytes_s
    compute = work.min_flops / flop_s
    memory = work.floor_bytes(ceilings.cache_bytes) / bytes_s
    return (compute, "compute") if compute >= memory else (memory, "memory")


def attain(work: Work, ceilings: Ceilings, measured_s: float) -> Attainment:
    floor, bound = floor_seconds(work, ceilings)
    return Attainment(floor_s=floor, floor_best_s=floor_seconds(work, ceilings, best=True)[0], bound=bound,
                      measured_s=measured_s, mfu=work.flops / measured_s / ceilings.flop_s,
                      mbu=work.bytes / measured_s / ceilings.bytes_s)


@dataclass(frozen=True)
class ServedModel:
    """What the roofline needs of a served configuration: the model's shapes and the bytes of its weights and of its
    KV cache elements; or why there is no roofline (`omitted`)."""

    shape: ModelShape | None
    weight_itemsize: int = 2
    kv_itemsize: int = 2
    omitted: str = ""


def served_model(model: Path, engine_args: Mapping[str, object]) -> ServedModel:
    """The served model of a checkpoint directory under engine args (dtype, kv_cache_dtype); a config the roofline
    cannot count gives a ServedModel that says why, never a guess."""
    try:
        shape = load_model_shape(model)
        cfg = json.loads((model / "config.json" if model.is_dir() else model).read_text())
        # the checkpoint's own dtype for "auto"; without one, 2 bytes (fewer bytes only lower the floor)
        own = cfg.get("dtype") or cfg.get("torch_dtype") or (cfg.get("text_config") or {}).get("dtype")
        weights = dtype_bytes(engine_args.get("dtype"), fallback=own)
        kv = engine_args.get("kv_cache_dtype")
        return ServedModel(shape=shape, weight_itemsize=weights,
                           kv_itemsize=weights if kv in (None, "auto") else dtype_bytes(kv))
    except RooflineUnavailable as exc:
        return ServedModel(shape=None, omitted=str(exc))


def workload_of(cell: Cell, bench: BenchmarkConfig) -> Workload:
    return Workload(input_len=cell.input_len, output_len=cell.output_len, num_prompts=bench.prompts_for(cell),
                    concurrency=bench.max_concurrency)


def _headline(cell: Cell) -> str:
    return "prefill_tok_s" if cell.is_prefill else "total_token_throughput"


def measured_seconds(cell: Cell, num_prompts: int, metrics: Mapping[str, object]) -> float | None:
    """A run's seconds, from its headline throughput (None when the row lacks it)."""
    tokens = cell.input_len if cell.is_prefill else cell.input_len + cell.output_len
    rate = metrics.get(_headline(cell))
    if not isinstance(rate, int | float) or rate <= 0:
        return None
    return num_prompts * tokens / float(rate)


def _work(served: ServedModel, cell: Cell, bench: BenchmarkConfig) -> Work | str:
    if served.shape is None:
        return served.omitted
    if cell.has_images:
        return "image cells: the vision tower's work is not counted"
    return cell_work(served.shape, workload_of(cell, bench), weight_itemsize=served.weight_itemsize,
                     kv_itemsize=served.kv_itemsize)


def cell_roofline(served: ServedModel, ceilings: Ceilings | None, cell: Cell, bench: BenchmarkConfig,
                  metrics: Mapping[str, object]) -> dict[str, Any]:
    """One cell's roofline columns (JSON): its work, and with ceilings and a measurement, its floor and attainment."""
    work = _work(served, cell, bench)
    if isinstance(work, str):
        return {"omitted": work}
    out: dict[str, Any] = {"flops": work.flops, "min_flops": work.min_flops, "bytes": work.bytes,
                           "decode_steps": work.decode_steps}
    seconds = measured_seconds(cell, bench.prompts_for(cell), metrics)
    if ceilings is not None and seconds:
        out.update(attain(work, ceilings, seconds).to_json())
    return out


def roofline_rows(rows: Sequence[Mapping[str, Any]], served: ServedModel, ceilings: Ceilings | None,
                  bench: BenchmarkConfig) -> list[dict[str, Any]]:
    """A grid's rows (GridResult.table) with a "roofline" column each."""
    cells = {c.label: c for c in bench.cells()}
    return [{**row, "roofline": cell_roofline(served, ceilings, cells[str(row["cell"])], bench, row)}
            if str(row.get("cell")) in cells else dict(row) for row in rows]


def physics_of(served: ServedModel, ceilings: Ceilings | None, bench: BenchmarkConfig,
               metrics: Mapping[Cell, Mapping[str, Sequence[float]]]) -> dict[str, Physical]:
    """Each cell's fastest run against its floor at the host's best ceilings: what the accept rule quarantines on.
    Empty without ceilings or a countable model."""
    if ceilings is None or served.shape is None:
        return {}
    out = {}
    for cell, values in metrics.items():
        work = _work(served, cell, bench)
        key = _headline(cell)
        runs = [measured_seconds(cell, bench.prompts_for(cell), {key: v}) for v in values.get(key, [])]
        seconds = [s for s in runs if s is not None]
        if isinstance(work, Work) and seconds:
            out[cell.label] = Physical(measured_s=min(seconds), floor_s=floor_seconds(work, ceilings, best=True)[0])
    return out


# What served engines reach: ratchet's stock H200 grid (experiments/results/roofline.md) ran at most ~55 % of the
# measured matmul rate on prefill, ~40 % end to end. A claim that needs more than this is called out.
PLAUSIBLE = 0.6
CLAIM_METRICS = ("total", "output", "prefill")


@dataclass(frozen=True)
class ClaimVerdict:
    tok_s: float
    metric: str             # what the tok/s counts: "total" (prompt + generated), "output", "prefill" (prompt)
    load: Workload
    seconds: float          # what the workload would take at the claimed rate
    need_served: float      # share of the peak needed, every layer on every prompt token (vLLM's default)
    need_min: float         # share of the peak needed for the least work (module docstring of harness/roofline.py)
    bound: str
    verdict: str            # "possible" | "needs" | "impossible"
    text: str


def claim_seconds(load: Workload, tok_s: float, metric: str) -> float:
    tokens = {"total": load.tokens, "output": load.num_prompts * load.output_len,
              "prefill": load.num_prompts * load.input_len}[metric]
    return tokens / tok_s


def _verdict(need_served: float, need_min: float, plausible: float) -> tuple[str, str]:
    if need_min > 1:
        return "impossible", (f"impossible unless tokens are skipped (prefix cache, speculation) or counted "
                              f"differently: the least work needs {need_min:.0%} of peak")
    if need_served > 1:
        return "needs", (f"needs >= {need_min:.0%} of peak, and only with the KV-shared layers skipped on prompt "
                         f"tokens (kv_sharing_fast_prefill); as vLLM serves by default {need_served:.0%}: impossible")
    if need_served > plausible:
        return "needs", (f"needs >= {need_served:.0%} of peak as served ({need_min:.0%} at least): more than "
                         f"served engines reach (~{plausible:.0%})")
    return "possible", f"possible: needs >= {need_served:.0%} of peak as served ({need_min:.0%} at least)"


def judge_claim(shape: ModelShape, load: Workload, ceilings: Ceilings, tok_s: float, *, metric: str = "total",
                weight_itemsize: int = 2, kv_itemsize: int = 2, plausible: float = PLAUSIBLE) -> ClaimVerdict:
    """The share of the hardware's peak (the fastest ceilings) a claimed throughput implies on a workload, and a
    plain verdict."""
    if metric not in CLAIM_METRICS:
        raise ValueError(f"metric {metric!r}: one of {', '.join(CLAIM_METRICS)}")
    if tok_s <= 0:
        raise ValueError(f"a claimed throughput must be positive, not {tok_s}")
    work = cell_work(shape, load, weight_itemsize=weight_itemsize, kv_itemsize=kv_itemsize)
    seconds = claim_seconds(load, tok_s, metric)
    memory = work.floor_bytes(ceilings.cache_bytes) / seconds / ceilings.bytes_s_best
    served = max(work.flops / seconds / ceilings.flop_s_best, memory)
    least = max(work.min_flops / seconds / ceilings.flop_s_best, memory)
    verdict, text = _verdict(served, least, plausible)
    bound = "memory" if memory >= least else "compute"
    return ClaimVerdict(tok_s=tok_s, metric=metric, load=load, seconds=seconds, need_served=served, need_min=least,
                        bound=bound, verdict=verdict, text=text)
