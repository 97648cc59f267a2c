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

from typing import Any

import torch

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


def make_sequence(mode: str, length: int, gen: torch.Generator) -> list[int]:
    """One task sequence of ``length`` tokens (header included) in the given mode."""
    n = length - HEADER
    idx = torch.arange(n)
    if mode == "short":
        first = torch.randint(FIRST_PAYLOAD_ID, VOCAB_SIZE, (SHORT_PERIOD,), generator=gen)
        payload = first[idx % SHORT_PERIOD]
    else:
        even = torch.randint(FIRST_PAYLOAD_ID, SPLIT_ID, (SHORT_PERIOD // 2,), generator=gen)
        odd = torch.randint(SPLIT_ID, VOCAB_SIZE, (LONG_PERIOD // 2,), generator=gen)
        half = idx // 2
        payload = torch.where(idx % 2 == 0, even[half % (SHORT_PERIOD // 2)], odd[half % (LONG_PERIOD // 2)])
    return [BOS_ID, MODES[mode][0], *payload.tolist()]


def determined(mode: str, length: int) -> torch.Tensor:
    """Mask over a sequence's indices: True where the token is a copy (determined by earlier ones)."""
    i = torch.arange(length) - HEADER
    if mode == "short":
        return i >= SHORT_PERIOD
    return ((i % 2 == 0) & (i >= SHORT_PERIOD)) | ((i % 2 == 1) & (i >= LONG_PERIOD))


def make_batch(batch: int, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Even rows <short>, odd rows <mixed>, plus the mask of determined (copy) targets."""
    modes = ["short" if i % 2 == 0 else "mixed" for i in range(batch)]
    rows = [make_sequence(m, length, gen) for m in modes]
    return torch.tensor(rows), torch.stack([determined(m, length) for m in modes])
