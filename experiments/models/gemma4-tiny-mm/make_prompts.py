"""Write the multimodal checkpoint's parity prompt sets (reproducible from fixed seeds).

    .venv/bin/python experiments/models/gemma4-tiny-mm/make_prompts.py

experiments/prompts/gemma4-tiny-mm-parity.jsonl    held set (never shown to the agent), seed 3001
experiments/prompts/gemma4-tiny-mm-visible.jsonl   visible set (the agent may read it), seed 4002

Each set holds text prompts of the copy task (the shipped spec's text input lengths, both modes) and reading
prompts with a picture at the image cells' text lengths and in between. One JSON object per line: `id`,
`prompt_token_ids` (text tokens, one `<|image|>` placeholder per picture), `expected_token_ids` (64 tokens, all
determined: copies, or the picture's cells), and for reading prompts `content`: the chat message parts (text,
then the picture as a data: URL), which parity sends to the chat endpoint.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import torch
from task import (
    IMAGE_ID,
    READ_ID,
    SIDE,
    TASK,
    png_bytes,
    random_cells,
    read_prompt_ids,
    symbol,
    text_prefix,
    token_strings,
)

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = ROOT / "experiments" / "prompts"
NEW_TOKENS = 64
TEXT_LENS = (128, 512)          # the spec's text cells
READ_TEXT_LENS = (16, 128)      # the spec's image cells (text tokens, <bos> and <read> included)


def text_prompts(prefix: str, seed: int) -> list[dict[str, object]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for length in TEXT_LENS:
        for k in range(4):
            mode = "short" if k % 2 == 0 else "mixed"
            seq = TASK.make_sequence(mode, length + NEW_TOKENS, gen)
            out.append({"id": f"{prefix}-text-in{length}-{k}", "prompt_token_ids": seq[:length],
                        "expected_token_ids": seq[length:]})
    return out


def read_prompts(prefix: str, seed: int, count: int) -> list[dict[str, object]]:
    """Reading prompts: the image cells' text lengths twice each, the rest between 2 and 128, picture sizes
    96 and 192 px (the processor resizes both to the same 24 x 24 patches)."""
    gen = torch.Generator().manual_seed(seed)
    names = token_strings()
    out = []
    for i in range(count):
        length = READ_TEXT_LENS[i % 2] if i < 4 else int(torch.randint(2, 129, (1,), generator=gen))
        text = text_prefix(length - 2, gen)
        cells = random_cells(gen)
        side = SIDE if i % 3 else 2 * SIDE
        ids = read_prompt_ids(text)
        assert len(ids) == length + 1 and ids[-2:] == [READ_ID, IMAGE_ID]
        url = "data:image/png;base64," + base64.b64encode(png_bytes(cells, side)).decode()
        out.append({"id": f"{prefix}-image-in{length}-{i}", "prompt_token_ids": ids,
                    "expected_token_ids": [symbol(cells[k % len(cells)]) for k in range(NEW_TOKENS)],
                    "content": [{"type": "text", "text": " ".join(names[t] for t in ids[1:-1])},
                                {"type": "image_url", "image_url": {"url": url}}]})
    return out


def write(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {path}")


def main() -> None:
    write(PROMPTS / "gemma4-tiny-mm-parity.jsonl", text_prompts("held", 3001) + read_prompts("held", 3011, 16))
    write(PROMPTS / "gemma4-tiny-mm-visible.jsonl", text_prompts("visible", 4002) + read_prompts("visible", 4012, 8))


if __name__ == "__main__":
    main()
