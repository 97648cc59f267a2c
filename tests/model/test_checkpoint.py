"""The checkpoint, tokenizer, prompt files and planted patches are what the harness expects (fast)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from gemma4_tiny_paths import HELD, MODEL_DIR, VISIBLE, read_jsonl


def _config() -> dict[str, Any]:
    return json.loads((MODEL_DIR / "config.json").read_text())


def test_config_turns_on_gemma4s_distinctive_parts() -> None:
    c = _config()
    assert c["model_type"] == "gemma4_text" and c["architectures"] == ["Gemma4ForCausalLM"]
    assert c["hidden_size_per_layer_input"] > 0 and c["vocab_size_per_layer_input"] == c["vocab_size"]
    assert {"sliding_attention", "full_attention"} <= set(c["layer_types"])
    assert c["layer_types"][-1] == "full_attention"
    assert c["num_key_value_heads"] < c["num_attention_heads"]
    assert c["num_kv_shared_layers"] > 0
    full = [str(i) for i, t in enumerate(c["layer_types"]) if t == "full_attention"]
    assert all(c["per_layer_config"][i]["head_dim"] != c["head_dim"] for i in full)
    assert c["max_position_embeddings"] >= 4096
    # transformers < 5.19 (5.5 is what vLLM 0.26 needs on the H200) ignores per_layer_config and reads this
    assert all(c["per_layer_config"][i]["head_dim"] == c["global_head_dim"] for i in full)


def test_checkpoint_is_a_few_megabytes() -> None:
    assert (MODEL_DIR / "model.safetensors").stat().st_size < 16 * 2**20


def test_tokenizer_round_trips_random_ids_and_matches_the_vocab() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MODEL_DIR))
    vocab = _config()["vocab_size"]
    assert len(tok) == vocab
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    allowed = [i for i in range(vocab) if i not in tok.all_special_ids]
    ids = [allowed[(7 * k + 3) % len(allowed)] for k in range(2048)]
    assert tok.encode(tok.decode(ids), add_special_tokens=False) == ids
    assert tok.encode("t7 t8")[0] == tok.bos_token_id  # text prompts get <bos>, as in training


@pytest.mark.parametrize("path", [HELD, VISIBLE], ids=["held", "visible"])
def test_prompt_sets_cover_both_modes_and_lengths_beyond_twice_the_window(path: Path) -> None:
    rows = read_jsonl(path)
    window = _config()["sliding_window"]
    assert len(rows) >= (48 if path == HELD else 16)
    assert {r["mode"] for r in rows} == {"short", "mixed"}
    lengths = [len(r["prompt_token_ids"]) for r in rows]
    assert min(lengths) <= 16 and max(lengths) > 2 * window
    for r in rows:  # a full period in every prompt: all 64 continuation tokens are determined
        assert len(r["prompt_token_ids"]) >= 2 + max(r["periods"]) and len(r["expected_token_ids"]) == 64


def test_held_and_visible_prompts_do_not_overlap() -> None:
    held = {tuple(r["prompt_token_ids"]) for r in read_jsonl(HELD)}
    assert not held & {tuple(r["prompt_token_ids"]) for r in read_jsonl(VISIBLE)}


@pytest.mark.parametrize("patch", sorted((MODEL_DIR / "planted").glob("*.patch")), ids=lambda p: p.stem)
def test_planted_patch_applies_to_the_installed_vllm(patch: Path, tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    site = Path(spec.origin).parents[1]
    rel = "vllm/model_executor/models/gemma4.py"
    (tmp_path / rel).parent.mkdir(parents=True)
    shutil.copy2(site / rel, tmp_path / rel)
    subprocess.run(["git", "apply", "--check", str(patch)], cwd=tmp_path, check=True, timeout=60)
