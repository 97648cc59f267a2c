"""Writes the checkpoint's non-weight files: tokenizer (with the multimodal special tokens and a chat template),
image/video/audio processors, and the model config. Shared by train.py and the tests."""

from __future__ import annotations

from pathlib import Path

from task import BOS_ID, EOS_ID, EXTRA, MAX_SOFT_TOKENS, PATCH, POOL, SPECIAL, model_config, token_strings

# Renders OpenAI-style chat messages as the model's prompt: <bos>, then each message's text and one <|image|>
# placeholder per image, in order (no role markers: the checkpoint is a base model). vLLM's chat endpoint,
# which `vllm bench serve --dataset-name random-mm` uses, needs a template.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' or item['type'] == 'image_url' %}"
    "<|image|>{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
)


def write_tokenizer(out: Path):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    strings = token_strings()
    vocab = {s: i for i, s in enumerate(strings)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tk.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)]
    )
    # Special tokens are split out before whitespace splitting: the processor writes "<boi><|image|>...<eoi>"
    # with no spaces between them.
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in [*SPECIAL.values(), *EXTRA]])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<pad>",
        model_max_length=4096,
        extra_special_tokens=dict(SPECIAL),
        chat_template=CHAT_TEMPLATE,
    )
    assert fast.convert_tokens_to_ids("<eos>") == EOS_ID
    fast.save_pretrained(str(out))
    return fast


def write_processor(out: Path) -> None:
    from transformers import (
        Gemma4AudioFeatureExtractor,
        Gemma4ImageProcessor,
        Gemma4Processor,
        Gemma4VideoProcessor,
    )

    tokenizer = write_tokenizer(out)
    image = Gemma4ImageProcessor(patch_size=PATCH, pooling_kernel_size=POOL, max_soft_tokens=MAX_SOFT_TOKENS)
    video = Gemma4VideoProcessor(patch_size=PATCH, pooling_kernel_size=POOL, max_soft_tokens=MAX_SOFT_TOKENS)
    proc = Gemma4Processor(feature_extractor=Gemma4AudioFeatureExtractor(), image_processor=image,
                           tokenizer=tokenizer, video_processor=video, chat_template=None,
                           image_seq_length=64)
    proc.save_pretrained(str(out))


def make_config():
    from transformers import Gemma4Config

    config = Gemma4Config(**model_config())
    config.architectures = ["Gemma4ForConditionalGeneration"]
    config.text_config.eos_token_id = EOS_ID
    return config
