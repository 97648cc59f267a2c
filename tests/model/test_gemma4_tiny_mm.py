"""The multimodal checkpoint: its files are what vLLM's Gemma 4 multimodal path loads, it reads the picture
(transformers reference, teacher-forced, on held prompts), it trains reproducibly, and its planted bugs apply to
the installed vLLM (fast; the vLLM runs are tests/agent/test_multimodal_vllm.py and evaluate.py)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "experiments" / "models" / "gemma4-tiny-mm"
HELD = ROOT / "experiments" / "prompts" / "gemma4-tiny-mm-parity.jsonl"
sys.path.insert(0, str(MODEL))
import task  # noqa: E402


def _held() -> list[dict]:
    return [json.loads(line) for line in HELD.read_text().splitlines() if line.strip()]


def test_the_checkpoint_is_gemma4_with_a_vision_tower_and_the_processors_tokens() -> None:
    config = json.loads((MODEL / "config.json").read_text())
    assert config["architectures"] == ["Gemma4ForConditionalGeneration"] and config["audio_config"] is None
    assert config["vision_config"]["patch_size"] == task.PATCH and config["vision_config"]["pooling_kernel_size"] == 3
    assert (config["image_token_id"], config["boi_token_id"], config["eoi_token_id"]) == \
        (task.IMAGE_ID, task.BOI_ID, task.EOI_ID)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    assert tok.image_token == "<|image|>" and tok.image_token_id == task.IMAGE_ID
    # the processor's expansion, written without spaces, splits into the special tokens
    assert tok("<read><boi><|image|><|image|><eoi>", add_special_tokens=False).input_ids == \
        [task.READ_ID, task.BOI_ID, task.IMAGE_ID, task.IMAGE_ID, task.EOI_ID]
    rendered = tok.apply_chat_template([{"role": "user", "content": [
        {"type": "text", "text": "<short> t7 <read>"}, {"type": "image"}]}], tokenize=False)
    assert rendered == "<bos><short> t7 <read><|image|>"
    assert (MODEL / "model.safetensors").stat().st_size < 8 * 2**20


def _picture(prompt: dict):
    from PIL import Image

    url = prompt["content"][1]["image_url"]["url"]
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")


def test_the_reference_reads_every_held_picture_with_confident_margins() -> None:
    import torch
    from transformers import AutoProcessor, Gemma4ForConditionalGeneration

    torch.set_num_threads(1)
    model = Gemma4ForConditionalGeneration.from_pretrained(str(MODEL), dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(MODEL))
    prompts = [p for p in _held() if p.get("content")][:6]
    assert len(prompts) == 6
    for p in prompts:
        # the user's ids end in one <|image|>; the processor expands it to <boi> <|image|> x 64 <eoi>
        expanded = [*p["prompt_token_ids"][:-1], task.BOI_ID, *[task.IMAGE_ID] * task.CELLS, task.EOI_ID]
        ids = torch.tensor([expanded + p["expected_token_ids"]])
        pixels = processor.image_processor([_picture(p)], return_tensors="pt")
        with torch.no_grad():
            logits = model(input_ids=ids, pixel_values=pixels["pixel_values"],
                           image_position_ids=pixels["image_position_ids"]).logits[0, len(expanded) - 1:-1]
        top = logits.float().log_softmax(-1).topk(2, dim=-1)
        assert top.indices[:, 0].tolist() == p["expected_token_ids"], p["id"]
        assert float((top.values[:, 0] - top.values[:, 1]).min()) > 1.0, p["id"]


def test_training_is_reproducible(tmp_path: Path) -> None:
    digests = []
    for run in ("a", "b"):
        out = tmp_path / run
        subprocess.run([sys.executable, str(MODEL / "train.py"), "--steps", "2", "--read-batch", "2",
                        "--text-batch", "2", "--out", str(out)], check=True, capture_output=True, timeout=600)
        digests.append(hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest())
    assert digests[0] == digests[1]


@pytest.mark.parametrize("patch", sorted((MODEL / "planted").glob("*.patch")), ids=lambda p: p.stem)
def test_planted_bugs_apply_to_the_installed_vllm(patch: Path, tmp_path: Path) -> None:
    sys.path.insert(0, str(MODEL.parent / "gemma4-tiny"))
    from vllm_parity import make_overlay

    overlay = make_overlay(patch, tmp_path / "overlay")
    target = overlay / "vllm" / "model_executor" / "models" / "gemma4_mm.py"
    assert not target.is_symlink() and "+" in patch.read_text()
    added = [line[1:] for line in patch.read_text().splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert all(line in target.read_text() for line in added)


def test_held_prompts_carry_pictures_inline_and_their_answers() -> None:
    from harness.parity import load_prompts

    prompts = load_prompts(HELD)
    with_pictures = [p for p in prompts if p.has_images]
    assert len(with_pictures) >= 8 and len(prompts) - len(with_pictures) >= 8
    assert all(p.expected is not None and len(p.expected) == 64 for p in prompts)
    assert all(p.token_ids[-2:] == (task.READ_ID, task.IMAGE_ID) for p in with_pictures)
