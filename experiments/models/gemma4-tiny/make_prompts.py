"""Write the parity prompt sets for the tiny Gemma 4 model (reproducible from fixed seeds).

    .venv/bin/python experiments/models/gemma4-tiny/make_prompts.py

experiments/prompts/gemma4-tiny-parity.jsonl   held set (never shown to the agent), seed 1001
experiments/prompts/gemma4-tiny-parity-grid.jsonl   the same plus held prompts at the grid's lengths (seed 1003):
                                                    what the shipped specs use
experiments/prompts/gemma4-tiny-visible.jsonl  visible set (the agent may read it), seed 2002

Both sets end with prompts at the embedded grid's input lengths (128, 512, 1024; seeds 1003 / 2004).
One JSON object per line: {"id", "mode", "periods", "prompt_token_ids", "expected_token_ids"}
("periods": [12] for <short>, [12, 40] for <mixed>, see task.py). Every prompt holds at least one
full period of each stream, so all 64 continuation tokens are copy positions whose correct value
("expected_token_ids") is determined by the prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from task import LONG_PERIOD, MODES, SHORT_PERIOD, SLIDING_WINDOW, make_sequence

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = ROOT / "experiments" / "prompts"
MAX_PROMPT_LEN = 160  # + 64 generated = 224 = the training sequence length
NEW_TOKENS = 64


def prompt_set(prefix: str, count: int, seed: int) -> list[dict[str, object]]:
    """``count`` prompts, modes alternating, lengths mixed from the mode's minimum to MAX_PROMPT_LEN.

    The first prompts pin the edges (shortest possible, just past 2x the window, the longest);
    the rest draw their length uniformly, so the set mixes lengths inside and beyond the window.
    """
    gen = torch.Generator().manual_seed(seed)
    edges = {"short": [16, 2 * SLIDING_WINDOW + 1, MAX_PROMPT_LEN],
             "mixed": [MODES["mixed"][1], MODES["mixed"][1] + 1, MAX_PROMPT_LEN]}
    periods = {"short": [SHORT_PERIOD], "mixed": [SHORT_PERIOD, LONG_PERIOD]}
    out: list[dict[str, object]] = []
    for i in range(count):
        mode = "short" if i % 2 == 0 else "mixed"
        lo = max(16, MODES[mode][1])  # at least one full period of each stream in the prompt
        k = i // 2
        length = edges[mode][k] if k < len(edges[mode]) else int(
            torch.randint(lo, MAX_PROMPT_LEN + 1, (1,), generator=gen))
        seq = make_sequence(mode, length + NEW_TOKENS, gen)
        out.append({"id": f"{prefix}-{i:03d}", "mode": mode, "periods": periods[mode],
                    "prompt_token_ids": seq[:length], "expected_token_ids": seq[length:]})
    return out


# The embedded grid's input lengths (experiments/gemma4-tiny-cpu.yaml): parity must see the lengths the
# benchmark measures (prefill chunking, many windows of sliding attention, long full-attention reach). The
# model was trained on 224 positions; its copy margins stay at least 5.4 nats up to 4,096 (measured with the
# transformers reference), so these prompts are as confident as the short ones.
GRID_INPUT_LENS = (128, 512, 1024)


def grid_set(prefix: str, per_mode: int, seed: int) -> list[dict[str, object]]:
    """``per_mode`` prompts of each mode at every grid input length, ids ``<prefix>-in<L>-<k>``."""
    gen = torch.Generator().manual_seed(seed)
    periods = {"short": [SHORT_PERIOD], "mixed": [SHORT_PERIOD, LONG_PERIOD]}
    out: list[dict[str, object]] = []
    for length in GRID_INPUT_LENS:
        for k in range(2 * per_mode):
            mode = "short" if k % 2 == 0 else "mixed"
            seq = make_sequence(mode, length + NEW_TOKENS, gen)
            out.append({"id": f"{prefix}-in{length}-{k}", "mode": mode, "periods": periods[mode],
                        "prompt_token_ids": seq[:length], "expected_token_ids": seq[length:]})
    return out


def write(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {path}")


def load(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    # The 64-prompt file stays as it was: campaign logs recorded against it (replay) check its hash.
    write(PROMPTS / "gemma4-tiny-parity.jsonl", prompt_set("held", 64, seed=1001))
    write(PROMPTS / "gemma4-tiny-parity-grid.jsonl", prompt_set("held", 64, seed=1001) + grid_set("held", 2, seed=1003))
    write(PROMPTS / "gemma4-tiny-visible.jsonl",
          prompt_set("visible", 32, seed=2002) + grid_set("visible", 1, seed=2004))
