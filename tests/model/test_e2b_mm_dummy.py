"""The E2B multimodal dummy (speed only): E2B's text and vision shapes, a tokenizer whose special tokens sit at the
ids the config names, and a processor that turns a 768 px picture into E2B's 256 soft tokens."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "models" / "gemma4-e2b-mm-dummy" / "make_e2b_mm_dummy.py"


def test_the_e2b_multimodal_dummy_has_e2bs_shapes_and_a_consistent_processor(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], check=True, capture_output=True, timeout=600)
    from PIL import Image
    from transformers import AutoConfig, AutoProcessor

    config = AutoConfig.from_pretrained(str(tmp_path))
    assert config.architectures == ["Gemma4ForConditionalGeneration"] and config.audio_config is None
    text, vision = config.text_config, config.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.sliding_window) == (1536, 35, 512)
    assert (vision.hidden_size, vision.num_hidden_layers, vision.patch_size, vision.pooling_kernel_size) == \
        (768, 16, 16, 3)
    assert vision.default_output_length == 280
    processor = AutoProcessor.from_pretrained(str(tmp_path))
    ids = processor(text=["t5 t6 <|image|>"], images=[[Image.new("RGB", (768, 768))]], return_tensors="pt")[
        "input_ids"][0].tolist()
    assert ids.count(config.image_token_id) == 256
    assert ids[:3] == [5, 6, config.boi_token_id] and ids[-1] == config.eoi_token_id
    # the committed files are what the script writes (tokenizer.json is generated where it is needed)
    committed = SCRIPT.parent
    for name in ("config.json", "processor_config.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (committed / name).read_text() == (tmp_path / name).read_text(), name
