"""How confident the checkpoint stays far beyond its 224 training positions: the top-1/top-2 margin at every
copy position of task sequences up to 4,096 tokens, with the transformers reference (one thread).

    .venv/bin/python experiments/models/gemma4-tiny/long_margins.py
    -> experiments/results/gemma4-tiny-long-margins.json

Parity's held prompts reach 1,024 + 64 tokens and the copy-task benchmark prompts 1,024 + 64 on the
embedded grid: both rely on these margins.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from reference import load_model  # noqa: E402
from task import determined, make_sequence  # noqa: E402

OUT = HERE.parents[1] / "results" / "gemma4-tiny-long-margins.json"
LENGTHS = (224, 600, 1152, 2200, 4096)
PER_MODE = 2


@torch.no_grad()
def main() -> int:
    torch.set_num_threads(1)
    started = time.monotonic()
    model = load_model(HERE)
    gen = torch.Generator().manual_seed(7)
    rows = []
    for length in LENGTHS:
        for mode in ("short", "mixed"):
            gaps, correct, beyond = [], 0, []
            for _ in range(PER_MODE):
                seq = make_sequence(mode, length, gen)
                x = torch.tensor([seq])
                logp = torch.log_softmax(model(input_ids=x).logits.float(), -1)[0, :-1]
                mask = determined(mode, length)[1:]
                top = logp.topk(2, -1).values
                gap = (top[:, 0] - top[:, 1])[mask]
                pos = torch.arange(length - 1)[mask]
                gaps.append(gap)
                beyond.append(gap[pos >= 224])
                correct += int((logp.argmax(-1) == x[0, 1:])[mask].all())
            allg, late = torch.cat(gaps), torch.cat(beyond)
            rows.append({"length": length, "mode": mode, "sequences": PER_MODE, "all_copies_correct": correct,
                         "min_margin": round(float(allg.min()), 3),
                         "min_margin_beyond_224": round(float(late.min()), 3) if late.numel() else None,
                         "share_at_least_1_nat": float((allg >= 1).float().mean())})
            print(rows[-1], flush=True)
    OUT.write_text(json.dumps({"what": "top-1/top-2 margins at the copy positions of task sequences, transformers "
                                       "reference, float32, one thread", "command":
                               ".venv/bin/python experiments/models/gemma4-tiny/long_margins.py",
                               "wall_s": round(time.monotonic() - started, 1), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
