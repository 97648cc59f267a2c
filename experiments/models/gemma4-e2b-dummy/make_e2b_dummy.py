"""Write the Gemma 4 E2B text config (public shapes) and a WordLevel tokenizer with the real vocab size.

For speed runs only (`load_format: dummy`): the weights are random, so the tokens mean nothing and this
directory is never good for parity. `vllm bench serve --dataset-name random` needs a tokenizer whose
vocab matches the model's (262144); a WordLevel tokenizer over `t<id>` words decodes random ids to
space-separated words that re-encode to the same ids, so prompt lengths come out exact.

    python make_e2b_dummy.py [OUT_DIR]      # default: this script's folder

config.json and tokenizer_config.json are small and committed; tokenizer.json (~5 MB) is generated
where it is needed (git-ignored here). Needs transformers (Gemma4TextConfig) and tokenizers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB = 262144
SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")


def write_config(out: Path) -> None:
    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig

    cfg = Gemma4TextConfig(
        hidden_size=1536, intermediate_size=6144, num_hidden_layers=35, num_attention_heads=8,
        num_key_value_heads=1, head_dim=256, global_head_dim=512, sliding_window=512,
        vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=256,
        num_kv_shared_layers=20, use_double_wide_mlp=True, final_logit_softcapping=30.0,
        layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7,
        max_position_embeddings=131072, tie_word_embeddings=True,
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )
    cfg.architectures = ["Gemma4ForCausalLM"]
    cfg.save_pretrained(out)


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({f"t{i}": i for i in range(len(SPECIALS), VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)   # joins words with single spaces
    tok.add_special_tokens(list(SPECIALS))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "backend": "tokenizers", "tokenizer_class": "TokenizersBackend", "bos_token": "<bos>",
        "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 131072,
    }, indent=2, sort_keys=True) + "\n")


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(__file__).resolve().parent
    out.mkdir(parents=True, exist_ok=True)
    write_config(out)
    write_tokenizer(out)
    print(f"wrote {out}/config.json, tokenizer.json, tokenizer_config.json (vocab {VOCAB})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
