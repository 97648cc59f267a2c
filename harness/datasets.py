"""Benchmark prompts whose greedy continuation is determined: the embedded checkpoint's copy task.

`vllm bench serve --dataset-name random` sends random token ids: the embedded tiny Gemma 4 was trained
on a copying task, and outside it its top-1/top-2 margins are small (eager and compiled vLLM already
disagreed on 2 of 16 such prompts), so comparing the benchmark's own outputs between two builds could
only report ties. `copy-task` writes, for each (cell, repeat), distinct prompts of exactly the cell's
input length in that task (experiments/models/gemma4-tiny/task.py: `<short>` copies from 12 back,
`<mixed>` interleaves a copy from 12 back with one from 40 back), as the pristine client's `custom`
dataset. Every generated token is then a confident copy (margins of at least 5.4 nats measured up to 4,096
positions), so workload parity (harness/workload.py) can judge every benchmark request, and parity
traffic is the benchmark's own traffic.

Prompts differ per cell and per repeat (the seed covers both), so no server ever sees one twice:
prefix caching cannot turn a later run into cache hits.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from harness.config import Cell
from harness.errors import BenchmarkFailed

__all__ = ["copy_task_prompts", "write_copy_task", "copy_task_answer", "MODE_TOKENS", "MIN_INPUT_LEN"]

FIRST_PAYLOAD_ID, SPLIT_ID, VOCAB_SIZE = 5, 130, 256
SHORT_PERIOD, LONG_PERIOD = 12, 40
MODE_TOKENS = {"short": "<short>", "mixed": "<mixed>"}
_HEADER = 2   # <bos> (added by the tokenizer's post-processor, counted in the input length) and the mode
MIN_INPUT_LEN = _HEADER + LONG_PERIOD   # a full period of both streams, so every generated token is determined


def _sequence(mode: str, n: int, rng: random.Random) -> list[int]:
    if mode == "short":
        first = [rng.randrange(FIRST_PAYLOAD_ID, VOCAB_SIZE) for _ in range(SHORT_PERIOD)]
        return [first[i % SHORT_PERIOD] for i in range(n)]
    even = [rng.randrange(FIRST_PAYLOAD_ID, SPLIT_ID) for _ in range(SHORT_PERIOD // 2)]
    odd = [rng.randrange(SPLIT_ID, VOCAB_SIZE) for _ in range(LONG_PERIOD // 2)]
    return [even[(i // 2) % (SHORT_PERIOD // 2)] if i % 2 == 0 else odd[(i // 2) % (LONG_PERIOD // 2)]
            for i in range(n)]


def copy_task_prompts(cell: Cell, count: int, *, seed: int, repeat: int) -> list[str]:
    """`count` prompt texts of `cell.input_len` tokens (with the <bos> the server adds), modes alternating."""
    if cell.input_len < MIN_INPUT_LEN:
        raise BenchmarkFailed(f"copy-task prompts need input_len >= {MIN_INPUT_LEN}; {cell.label} is shorter")
    rng = random.Random(f"copy-task:{seed}:{repeat}:{cell.input_len}:{cell.output_len}")
    out = []
    for i in range(count):
        mode = "short" if i % 2 == 0 else "mixed"
        payload = _sequence(mode, cell.input_len - _HEADER, rng)
        out.append(" ".join([MODE_TOKENS[mode], *(f"t{t}" for t in payload)]))
    return out


def write_copy_task(path: Path, cell: Cell, count: int, *, seed: int, repeat: int) -> list[str]:
    """The prompts as the client's `custom` JSONL (one {"prompt"} per line, order kept: --disable-shuffle)."""
    prompts = copy_task_prompts(cell, count, seed=seed, repeat=repeat)
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return prompts


def copy_task_answer(prompt: str, n: int) -> list[str]:
    """The task's right continuation of a copy-task prompt: the next `n` tokens, as token strings."""
    mode, *seq = prompt.split()
    out = []
    for _ in range(n):
        i = len(seq)    # payload index of the next token
        back = SHORT_PERIOD if mode == MODE_TOKENS["short"] or i % 2 == 0 else LONG_PERIOD
        seq.append(seq[i - back])
        out.append(seq[-1])
    return out
