"""Writes a small random-weight Gemma 4 checkpoint with a WordLevel tokenizer.

Good for speed tests of the harness only: random weights give near-tie logits, so greedy tokens
flip under harmless numeric changes (parity tests use the trained experiments/models/gemma4-tiny).
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 256
SPECIALS = ("<pad>", "<eos>", "<bos>")


def write_tokenizer(out: Path, vocab: int = VOCAB) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    names = list(SPECIALS) + [f"t{i}" for i in range(vocab - len(SPECIALS))]
    tok = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with single spaces
    tok.add_special_tokens(list(SPECIALS))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "pad_token": "<pad>",
                "eos_token": "<eos>",
                "bos_token": "<bos>",
                "model_max_length": 4096,
            }
        )
    )


def write_random_gemma4(out: Path, *, seed: int = 0) -> Path:
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = Gemma4TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=32,
        sliding_window=32,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=4096,
        vocab_size_per_layer_input=VOCAB,
        hidden_size_per_layer_input=16,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    config.architectures = ["Gemma4ForCausalLM"]
    model = Gemma4ForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    write_tokenizer(out)
    return out


if __name__ == "__main__":
    import sys

    print(write_random_gemma4(Path(sys.argv[1])))
