"""Write Gemma 4 E2B with its vision tower (public shapes) for speed runs of image cells on dummy weights.

    python make_e2b_mm_dummy.py [OUT_DIR]      # default: this script's folder

The text model is ../gemma4-e2b-dummy's (E2B's text shapes); the vision tower is transformers' Gemma4VisionConfig
defaults, which are E2B's (hidden 768, 16 layers of 12 heads of 64, patch 16 px, 3 x 3 pooling, 280 soft tokens per
picture at most); no audio tower (the image cells do not use it). The tokenizer is the text dummy's WordLevel
tokenizer over `t<id>` with the processor's special tokens at E2B's ids (`<|image|>` 258880, `<boi>` 255999,
`<eoi>` 258882, ...) and a chat template that places one `<|image|>` per picture. For speed only
(`load_format: dummy`): never for parity. config.json, tokenizer_config.json, processor_config.json and
chat_template.jinja are committed; tokenizer.json (~5 MB) is generated where it is needed (git-ignored here).
Needs transformers and tokenizers (and torchvision's Python side for the processor, as vLLM does).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gemma4-e2b-dummy"))
from make_e2b_dummy import SPECIALS, VOCAB  # noqa: E402

# The Gemma 4 processor's tokens at the ids Gemma4Config gives them (E2B's).
MM_TOKENS = {"<|image|>": 258880, "<boi>": 255999, "<eoi>": 258882, "<|audio|>": 258881, "<boa>": 256000,
             "<eoa>": 258883, "<|video|>": 258884}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' or item['type'] == 'image_url' %}"
    "<|image|>{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
)


def write_config(out: Path) -> None:
    import tempfile

    import make_e2b_dummy
    from transformers import Gemma4Config, Gemma4VisionConfig
    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig

    with tempfile.TemporaryDirectory() as tmp:      # the text dummy's config, as it writes it
        make_e2b_dummy.write_config(Path(tmp))
        text = Gemma4TextConfig.from_pretrained(tmp)
    vision = Gemma4VisionConfig()
    vision.default_output_length = 280       # vLLM reads the per-picture soft-token budget here
    config = Gemma4Config(text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=None,
                          boi_token_id=MM_TOKENS["<boi>"], eoi_token_id=MM_TOKENS["<eoi>"],
                          image_token_id=MM_TOKENS["<|image|>"], video_token_id=MM_TOKENS["<|video|>"],
                          boa_token_id=MM_TOKENS["<boa>"], eoa_token_index=MM_TOKENS["<eoa>"],
                          audio_token_id=MM_TOKENS["<|audio|>"], tie_word_embeddings=True)
    config.architectures = ["Gemma4ForConditionalGeneration"]
    config.save_pretrained(out)


def write_tokenizer_and_processor(out: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        Gemma4AudioFeatureExtractor,
        Gemma4ImageProcessor,
        Gemma4Processor,
        Gemma4VideoProcessor,
        PreTrainedTokenizerFast,
    )

    names = {i: tok for i, tok in enumerate(SPECIALS)} | {i: tok for tok, i in MM_TOKENS.items()}
    vocab = {names.get(i, f"t{i}"): i for i in range(VOCAB)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in [*SPECIALS, *MM_TOKENS]])
    extra = {"image_token": "<|image|>", "boi_token": "<boi>", "eoi_token": "<eoi>", "audio_token": "<|audio|>",
             "boa_token": "<boa>", "eoa_token": "<eoa>"}
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", model_max_length=131072, extra_special_tokens=extra,
                                   chat_template=CHAT_TEMPLATE)
    proc = Gemma4Processor(feature_extractor=Gemma4AudioFeatureExtractor(), image_processor=Gemma4ImageProcessor(),
                           tokenizer=fast, video_processor=Gemma4VideoProcessor(), image_seq_length=280)
    proc.save_pretrained(str(out))


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else HERE
    out.mkdir(parents=True, exist_ok=True)
    write_config(out)
    write_tokenizer_and_processor(out)
    print(f"wrote {out}: config.json, tokenizer, processor_config.json, chat_template.jinja (vocab {VOCAB})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
