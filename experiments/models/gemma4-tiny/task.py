"""The synthetic task, token ids and model shape shared by train.py, make_prompts.py and evaluate.py.

Task ("mode-selected copying"): ``<bos> <mode> payload...`` where the payload repeats itself at fixed
offsets after a random first period.
  <short>: one stream, x[i] = x[i-12]. The source sits at distance 11 from the predicting position:
           inside the sliding window (16), outside a halved window (8).
  <mixed>: two interleaved streams with disjoint token ranges; even payload positions copy from 12
           back (like <short>), odd positions from 40 back: beyond the window and beyond what the two
           sliding layers in front of the first full-attention layer can relay (2 x 15), so a
           full-attention layer must fetch it. The current token's range tells which stream comes next.
Every generated token of a <mixed> prompt alternates local and long-range copies, so a bug in either
attention path breaks every such prompt; <short> prompts can be as short as 16 tokens. Positions
after the first period(s) are determined exactly; the first period is random by construction.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # experiments/models: copy_task
from copy_task import CopyTask  # noqa: E402

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "FIRST_PAYLOAD_ID",
    "MIXED_ID",
    "LONG_PERIOD",
    "HEADER",
    "MODES",
    "PAD_ID",
    "SHORT_ID",
    "SHORT_PERIOD",
    "SLIDING_WINDOW",
    "VOCAB_SIZE",
    "config_kwargs",
    "make_batch",
    "token_strings",
]

VOCAB_SIZE = 256
PAD_ID, EOS_ID, BOS_ID, SHORT_ID, MIXED_ID = 0, 1, 2, 3, 4
FIRST_PAYLOAD_ID = 5  # payload tokens are 5..255 (251 symbols)
SPLIT_ID = 130  # <mixed>: the short stream uses 5..129, the long stream 130..255
HEADER = 2  # <bos> <mode>

SLIDING_WINDOW = 16
SHORT_PERIOD = 12  # source at distance 11: inside the window of 16, outside a halved window of 8
LONG_PERIOD = 40  # source at distance 39: > 2 sliding layers x 15 reach in front of the first full layer
# mode -> (mode token id, prompt length needed so that every following token is determined)
MODES = {"short": (SHORT_ID, HEADER + SHORT_PERIOD), "mixed": (MIXED_ID, HEADER + LONG_PERIOD)}


def token_strings() -> list[str]:
    """Surface form of every id: the tokenizer's vocabulary, in id order."""
    names = {PAD_ID: "<pad>", EOS_ID: "<eos>", BOS_ID: "<bos>", SHORT_ID: "<short>", MIXED_ID: "<mixed>"}
    return [names.get(i, f"t{i}") for i in range(VOCAB_SIZE)]


def config_kwargs() -> dict[str, Any]:
    """Gemma4TextConfig arguments of the checkpoint (one place, so train/eval/tests agree)."""
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # GQA
        "head_dim": 32,  # sliding layers
        "global_head_dim": 64,  # full-attention layers (heterogeneous head dims)
        "max_position_embeddings": 4096,
        "sliding_window": SLIDING_WINDOW,
        # sliding, sliding, FULL, sliding, sliding, FULL -- the last layer must be full.
        "layer_types": ["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2
        + ["full_attention"],
        # The last two layers (4: sliding, 5: full) reuse the KV of layers 3 and 2.
        "num_kv_shared_layers": 2,
        "vocab_size_per_layer_input": VOCAB_SIZE,
        "hidden_size_per_layer_input": 16,  # Per-Layer Embeddings on
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


# The task's one implementation (shared with the other parity checkpoint), sized by this checkpoint's constants.
TASK = CopyTask(vocab_size=VOCAB_SIZE, first_payload_id=FIRST_PAYLOAD_ID, split_id=SPLIT_ID, short_period=SHORT_PERIOD,
                long_period=LONG_PERIOD, bos_id=BOS_ID, short_id=SHORT_ID, mixed_id=MIXED_ID, header=HEADER)
make_sequence = TASK.make_sequence
determined = TASK.determined
make_batch = TASK.make_batch
