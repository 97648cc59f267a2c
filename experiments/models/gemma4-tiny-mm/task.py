"""The multimodal checkpoint's task, token ids and model shape (one place for train, prompts, eval, tests).

Reading task: ``<bos> <read> <boi> <|image|> x 64 <eoi>`` followed by the symbols of the picture's 8 x 8 cells in
raster order, repeated. Each cell is one solid colour out of 64 (4 levels per channel); its symbol is ``t(5 +
colour)``. The image is the only source of the first 64 answers, so every generated token is read off the picture:
a bug that moves, drops or perturbs image embeddings changes the answer. Images of any square size work: the
processor resizes to 24 x 24 patches of 4 px (96 px), which pool 3 x 3 into the 64 soft tokens, one per cell.

The text modes of the embedded text checkpoint (``<short>``/``<mixed>`` copying, see ../gemma4-tiny/task.py) are
trained too, so text prompts and the benchmark's random text still run through a model that works.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # experiments/models: copy_task
from copy_task import CopyTask  # noqa: E402

TEXT_VOCAB = 256  # ids 0..255 as in gemma4-tiny: <pad> <eos> <bos> <short> <mixed> t5..t255
PAD_ID, EOS_ID, BOS_ID, SHORT_ID, MIXED_ID = 0, 1, 2, 3, 4
FIRST_PAYLOAD_ID = 5
# Multimodal special tokens after the text vocabulary (names as the Gemma 4 processor expects them).
SPECIAL = {
    "image_token": "<|image|>",
    "boi_token": "<boi>",
    "eoi_token": "<eoi>",
    "audio_token": "<|audio|>",
    "boa_token": "<boa>",
    "eoa_token": "<eoa>",
}
EXTRA = ["<|video|>", "<read>"]
IMAGE_ID, BOI_ID, EOI_ID, AUDIO_ID, BOA_ID, EOA_ID, VIDEO_ID, READ_ID = range(TEXT_VOCAB, TEXT_VOCAB + 8)
VOCAB_SIZE = 272  # 264 used, rounded up; every id is also a Per-Layer-Embedding id

GRID = 8  # cells per side = soft tokens per side
CELLS = GRID * GRID  # 64 soft tokens per image
LEVELS = (0, 85, 170, 255)  # per channel: 4^3 = 64 colours, one per symbol
PATCH = 4
POOL = 3
SIDE = GRID * POOL * PATCH  # 96 px: the size the processor resizes every square image to
MAX_SOFT_TOKENS = 70  # the processor's smallest budget: 630 patches -> 24 x 24 square -> 64 soft tokens
READ_HEADER = 3 + CELLS + 1  # <bos> <read> <boi> img*64 <eoi>

SLIDING_WINDOW = 16
TASK = CopyTask(vocab_size=TEXT_VOCAB, first_payload_id=FIRST_PAYLOAD_ID, split_id=130, short_period=12,
                long_period=40, bos_id=BOS_ID, short_id=SHORT_ID, mixed_id=MIXED_ID)


def token_strings() -> list[str]:
    names = {PAD_ID: "<pad>", EOS_ID: "<eos>", BOS_ID: "<bos>", SHORT_ID: "<short>", MIXED_ID: "<mixed>"}
    text = [names.get(i, f"t{i}") for i in range(TEXT_VOCAB)]
    mm = [*SPECIAL.values(), *EXTRA]
    unused = [f"<unused{i}>" for i in range(VOCAB_SIZE - TEXT_VOCAB - len(mm))]
    return text + mm + unused


def colour(index: int) -> tuple[int, int, int]:
    return (LEVELS[index // 16], LEVELS[(index // 4) % 4], LEVELS[index % 4])


def symbol(index: int) -> int:
    return FIRST_PAYLOAD_ID + index


def random_cells(gen: torch.Generator) -> list[int]:
    return torch.randint(0, len(LEVELS) ** 3, (CELLS,), generator=gen).tolist()


def draw(cells: list[int], side: int = SIDE) -> torch.Tensor:
    """uint8 HWC picture of the cells (solid squares, raster order), ``side`` px square (a multiple of 8)."""
    rgb = torch.tensor([colour(c) for c in cells], dtype=torch.uint8).view(GRID, GRID, 3)
    step = side // GRID
    return rgb.repeat_interleave(step, 0).repeat_interleave(step, 1)


def png_bytes(cells: list[int], side: int = SIDE) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(draw(cells, side).numpy()).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def read_sequence(cells: list[int], answer_len: int, text: list[int] = ()) -> list[int]:
    """Token ids of a reading sequence: ``<bos>``, optional text (a copy-task payload the answers ignore),
    ``<read>``, the image block, then ``answer_len`` answers."""
    answers = [symbol(cells[k % CELLS]) for k in range(answer_len)]
    return [BOS_ID, *text, READ_ID, BOI_ID, *([IMAGE_ID] * CELLS), EOI_ID, *answers]


def read_prompt_ids(text: list[int] = ()) -> list[int]:
    """The prompt as a user sends it: one ``<|image|>`` placeholder, which the processor expands to
    ``<boi> <|image|> x 64 <eoi>``."""
    return [BOS_ID, *text, READ_ID, IMAGE_ID]


def text_prefix(length: int, gen: torch.Generator) -> list[int]:
    """``length`` tokens of text in front of ``<read>``: a copy-task sequence without its <bos>."""
    if length == 0:
        return []
    mode = "short" if torch.randint(0, 2, (1,), generator=gen).item() == 0 else "mixed"
    return TASK.make_sequence(mode, length + 1, gen)[1:]


def text_config() -> dict[str, Any]:
    """The text model: gemma4-tiny's shape with the vocabulary grown by the multimodal tokens."""
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "global_head_dim": 64,
        "max_position_embeddings": 4096,
        "sliding_window": SLIDING_WINDOW,
        "layer_types": ["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2
        + ["full_attention"],
        "num_kv_shared_layers": 2,
        "vocab_size_per_layer_input": VOCAB_SIZE,
        "hidden_size_per_layer_input": 16,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1_000_000.0},
        },
        "pad_token_id": PAD_ID,
        "eos_token_id": EOS_ID,
        "bos_token_id": BOS_ID,
        "tie_word_embeddings": True,
        "final_logit_softcapping": None,
    }


def vision_config() -> dict[str, Any]:
    return {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "patch_size": PATCH,
        "pooling_kernel_size": POOL,
        "position_embedding_size": 128,
        "default_output_length": MAX_SOFT_TOKENS,
    }


def model_config() -> dict[str, Any]:
    return {
        "text_config": text_config(),
        "vision_config": vision_config(),
        "audio_config": None,
        "boi_token_id": BOI_ID,
        "eoi_token_id": EOI_ID,
        "image_token_id": IMAGE_ID,
        "video_token_id": VIDEO_ID,
        "boa_token_id": BOA_ID,
        "eoa_token_index": EOA_ID,
        "audio_token_id": AUDIO_ID,
        "tie_word_embeddings": True,
    }
