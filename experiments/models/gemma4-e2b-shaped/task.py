"""The task, token ids and model shape of the E2B-shaped parity checkpoint (train.py, make_prompts.py).

Shapes: Gemma 4 E2B's own text config (`../gemma4-e2b-dummy/config.json`) with only the depth, the vocabulary
and the context cut down: hidden 1536, 8 query heads on 1 KV head, head dim 256 on sliding layers (window 512)
and 512 on full layers, the same RoPE per layer type, PLE of 256, double-wide MLP on the KV-shared layers,
final soft-cap 30; 10 layers ((4 sliding + 1 full) x 2, the last 4 KV-shared) and a 512-token vocabulary
instead of 35 layers and 262,144. Every attention shape a kernel or serving patch on E2B meets is here.

Task ("mode-selected copying", as the tiny checkpoint's, scaled to E2B's window):
  <short>: one stream, x[i] = x[i-12]: the source is inside the sliding window.
  <mixed>: two interleaved streams with disjoint token ranges: even payload positions copy from 12 back,
           odd ones from 600 back (past the 512-token window: the full layers fetch it, or sliding layers
           relay it). The current token's range tells which stream comes next.
Positions after the first period(s) are determined exactly, so every held prompt has a known answer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # experiments/models: copy_task
from copy_task import CopyTask  # noqa: E402

HERE = Path(__file__).resolve().parent
E2B_CONFIG = HERE.parent / "gemma4-e2b-dummy" / "config.json"

VOCAB_SIZE = 512
PAD_ID, EOS_ID, BOS_ID, SHORT_ID, MIXED_ID = 0, 1, 2, 3, 4
FIRST_PAYLOAD_ID = 5  # payload tokens 5..511
SPLIT_ID = 258  # <mixed>: the short stream uses 5..257, the long stream 258..511
HEADER = 2  # <bos> <mode>
SHORT_PERIOD = 12
LONG_PERIOD = 600  # beyond E2B's sliding window of 512
MODES = {"short": (SHORT_ID, HEADER + SHORT_PERIOD), "mixed": (MIXED_ID, HEADER + LONG_PERIOD)}
MAX_POSITIONS = 10240  # the E2B grid's max_model_len (8,192 + 256 needs 8,448)

NUM_LAYERS = 10
LAYER_TYPES = (["sliding_attention"] * 4 + ["full_attention"]) * 2
NUM_KV_SHARED = 4


def token_strings() -> list[str]:
    """Surface form of every id: the tokenizer's vocabulary, in id order."""
    names = {PAD_ID: "<pad>", EOS_ID: "<eos>", BOS_ID: "<bos>", SHORT_ID: "<short>", MIXED_ID: "<mixed>"}
    return [names.get(i, f"t{i}") for i in range(VOCAB_SIZE)]


def config_dict() -> dict[str, Any]:
    """config.json of the checkpoint: E2B's, with depth, vocabulary and context overridden (nothing else)."""
    cfg = json.loads(E2B_CONFIG.read_text())
    cfg.update(
        num_hidden_layers=NUM_LAYERS, layer_types=LAYER_TYPES, num_kv_shared_layers=NUM_KV_SHARED,
        vocab_size=VOCAB_SIZE, vocab_size_per_layer_input=VOCAB_SIZE, max_position_embeddings=MAX_POSITIONS,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID, dtype="bfloat16",
        architectures=["Gemma4ForCausalLM"],
    )
    cfg.pop("torch_dtype", None)
    return cfg


# The task's one implementation (shared with the other parity checkpoint), sized by this checkpoint's constants.
TASK = CopyTask(vocab_size=VOCAB_SIZE, first_payload_id=FIRST_PAYLOAD_ID, split_id=SPLIT_ID, short_period=SHORT_PERIOD,
                long_period=LONG_PERIOD, bos_id=BOS_ID, short_id=SHORT_ID, mixed_id=MIXED_ID, header=HEADER)
make_sequence = TASK.make_sequence
determined = TASK.determined
make_batch = TASK.make_batch


def write_static_files(out: Path) -> None:
    """config.json, generation_config.json and the tokenizer: small, deterministic, committed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config_dict(), indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}, indent=2) + "\n")
    vocab = {s: i for i, s in enumerate(token_strings())}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    tk.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)])
    tk.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "backend": "tokenizers", "bos_token": "<bos>", "eos_token": "<eos>", "model_max_length": MAX_POSITIONS,
        "pad_token": "<pad>", "tokenizer_class": "TokenizersBackend", "unk_token": "<pad>"}, indent=2) + "\n")


if __name__ == "__main__":
    write_static_files(HERE)
    print(f"wrote config and tokenizer to {HERE}")
