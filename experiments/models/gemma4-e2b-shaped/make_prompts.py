"""Write the parity prompt sets of the E2B-shaped checkpoint (reproducible from fixed seeds; independent of the
weights: the answers come from the task).

    .venv/bin/python experiments/models/gemma4-e2b-shaped/make_prompts.py

experiments/prompts/gemma4-e2b-shaped-parity.jsonl    held (never shown to the agent), seeds 3001 / 3003
experiments/prompts/gemma4-e2b-shaped-visible.jsonl   visible (the agent may read it), seeds 4002 / 4004

The held set fills a batch of the E2B grid's concurrency (256): prompts of 16 to 1,000 tokens, then 4 at each
of the grid's input lengths (512, 2,048, 8,192) and 2 at 8,384, so that prompt + 64 generated tokens reach the
grid's longest cell (8,192 + 256). Prompts at 512 are <short> only: a <mixed> prompt needs a full 600-token
period before its long stream is determined. One JSON object per line, as gemma4-tiny's:
{"id", "mode", "periods", "prompt_token_ids", "expected_token_ids"}.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from task import LONG_PERIOD, MODES, SHORT_PERIOD, make_sequence

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = ROOT / "experiments" / "prompts"
NEW_TOKENS = 64
FILL_MAX = 1000
GRID = ((512, ("short",) * 4), (2048, ("short", "mixed") * 2), (8192, ("short", "mixed") * 2),
        (8384, ("short", "mixed")))
PERIODS = {"short": [SHORT_PERIOD], "mixed": [SHORT_PERIOD, LONG_PERIOD]}


def row(rid: str, mode: str, length: int, gen: torch.Generator) -> dict[str, object]:
    seq = make_sequence(mode, length + NEW_TOKENS, gen)
    return {"id": rid, "mode": mode, "periods": PERIODS[mode], "prompt_token_ids": seq[:length],
            "expected_token_ids": seq[length:]}


def prompt_set(prefix: str, fill: int, seeds: tuple[int, int]) -> list[dict[str, object]]:
    gen = torch.Generator().manual_seed(seeds[0])
    out = []
    for i in range(fill):
        mode = "short" if i % 2 == 0 else "mixed"
        lo = max(16, MODES[mode][1])  # a full period of every stream
        out.append(row(f"{prefix}-{i:03d}", mode, int(torch.randint(lo, FILL_MAX + 1, (1,), generator=gen)), gen))
    gen = torch.Generator().manual_seed(seeds[1])
    for length, modes in GRID:
        out += [row(f"{prefix}-in{length}-{k}", mode, length, gen) for k, mode in enumerate(modes)]
    return out


def write(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts ({sum(len(r['prompt_token_ids']) for r in rows):,} tokens) to {path}")


if __name__ == "__main__":
    n_grid = sum(len(m) for _, m in GRID)
    write(PROMPTS / "gemma4-e2b-shaped-parity.jsonl", prompt_set("held", 256 - n_grid, (3001, 3003)))
    write(PROMPTS / "gemma4-e2b-shaped-visible.jsonl", prompt_set("visible", 32, (4002, 4004)))
