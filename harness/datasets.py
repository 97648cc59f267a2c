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

import io
import json
import random
from dataclasses import dataclass
from pathlib import Path

from harness.config import Cell
from harness.errors import BenchmarkFailed

__all__ = ["copy_task_prompts", "write_copy_task", "copy_task_answer", "MODE_TOKENS", "MIN_INPUT_LEN",
           "ReadRequest", "read_task_requests", "write_read_task", "read_task_picture"]

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


# The reading task of the embedded multimodal checkpoint (experiments/models/gemma4-tiny-mm/task.py): a picture of
# 8 x 8 solid cells, each one of 64 colours (4 levels per channel); the answer is the cells' symbols
# t(5 + colour) in raster order, repeated. The prompt is `<bos> [text] <read> <|image|>`: the text in front (a
# copy-task sequence) sets the cell's text length, and the model ignores it.
READ_TOKEN, IMAGE_PLACEHOLDER = "<read>", "<|image|>"
GRID, LEVELS = 8, (0, 85, 170, 255)


@dataclass(frozen=True)
class ReadRequest:
    text: str                 # what the user's message says before the picture (no <bos>, no placeholder)
    cells: tuple[int, ...]    # colour index per cell, raster order
    image: bytes              # PNG

    def answer(self, n: int) -> list[str]:
        return [f"t{FIRST_PAYLOAD_ID + self.cells[k % len(self.cells)]}" for k in range(n)]


def read_task_picture(cells: tuple[int, ...], size: int) -> bytes:
    """PNG of the cells: `size` px square, each cell a solid colour."""
    from PIL import Image

    step = size // GRID
    img = Image.new("RGB", (size, size))
    for k, c in enumerate(cells):
        colour = (LEVELS[c // 16], LEVELS[(c // 4) % 4], LEVELS[c % 4])
        x, y = (k % GRID) * step, (k // GRID) * step
        img.paste(colour, (x, y, x + step, y + step))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def read_task_requests(cell: Cell, count: int, *, seed: int, repeat: int) -> list[ReadRequest]:
    """`count` reading requests of `cell.input_len` text tokens (<bos> and <read> included), fresh per cell
    and repeat."""
    if not cell.has_images or cell.images != 1:
        raise BenchmarkFailed(f"read-task requests carry one picture; {cell.label} asks for {cell.images}")
    rng = random.Random(f"read-task:{seed}:{repeat}:{cell.label}")
    out = []
    for i in range(count):
        n = cell.input_len - 2     # text between <bos> and <read>: a mode token and a copy-task payload
        mode = "short" if i % 2 == 0 else "mixed"
        words = [MODE_TOKENS[mode], *(f"t{t}" for t in _sequence(mode, n - 1, rng))][:n] if n > 0 else []
        cells = tuple(rng.randrange(len(LEVELS) ** 3) for _ in range(GRID * GRID))
        out.append(ReadRequest(text=" ".join([*words, READ_TOKEN]), cells=cells,
                               image=read_task_picture(cells, cell.image_size)))
    return out


def write_read_task(path: Path, cell: Cell, count: int, *, seed: int, repeat: int) -> list[ReadRequest]:
    """The requests as the client's `custom_image` JSONL, pictures as PNG files beside it (order kept)."""
    requests = read_task_requests(cell, count, seed=seed, repeat=repeat)
    pictures = path.with_suffix("")
    pictures.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, req in enumerate(requests):
        png = pictures / f"{i:04d}.png"
        png.write_bytes(req.image)
        lines.append(json.dumps({"prompt": req.text, "image_files": [str(png.resolve())]}) + "\n")
    path.write_text("".join(lines))
    return requests
