"""The served roofline's counts against hand-computed values, and what it refuses to count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import RooflineUnavailable, UnknownArchitecture
from harness.physics import served_model
from harness.roofline import Workload, cell_work, dtype_bytes, load_model_shape, token_params
from tests.conftest import ROOT

MODELS = ROOT / "experiments" / "models"


def test_e2b_multiplies_3_75_gflop_per_token_as_the_issue_counts() -> None:
    """Gemma 4 E2B: 35 layers (7 full), hidden 1536, 8 query heads, 1 KV head, head dims 256 / 512 (full), MLP 6144,
    doubled on the 20 KV-shared layers (15..34, which have q and o only), PLE 256."""
    h = 1536
    mlp, wide = 3 * h * 6144, 3 * h * 12288
    ple = 2 * h * 256
    sliding, full = 8 * 256, 8 * 512                         # query width
    stored_sliding = 2 * h * sliding + h * 2 * 256 + mlp + ple
    stored_full = 2 * h * full + h * 2 * 512 + mlp + ple
    shared_sliding, shared_full = 2 * h * sliding + wide + ple, 2 * h * full + wide + ple
    layers = 12 * stored_sliding + 3 * stored_full + 16 * shared_sliding + 4 * shared_full
    per_token = layers + h * 256 * 35                         # + the PLE model projection
    shape = load_model_shape(MODELS / "gemma4-e2b-dummy")
    assert token_params(shape) == per_token == 1_876_819_968
    assert 2 * per_token / 1e9 == pytest.approx(3.754, abs=1e-3)     # the issue's "about 3.75 GFLOP"
    assert shape.lm_head == h * 262_144                      # 0.81 GFLOP more for each sampled token


def test_the_tiny_cpu_model_is_counted_by_hand() -> None:
    """6 layers (full: 2 and 5, head dim 64 from per_layer_config), hidden 128, 4 / 2 heads, MLP 256, PLE 16, the
    last 2 layers KV-shared."""
    h = 128
    mlp, ple = 3 * h * 256, 2 * h * 16
    stored_sliding = 2 * h * 4 * 32 + h * 2 * 2 * 32 + mlp + ple
    stored_full = 2 * h * 4 * 64 + h * 2 * 2 * 64 + mlp + ple
    shared_sliding, shared_full = 2 * h * 4 * 32 + mlp + ple, 2 * h * 4 * 64 + mlp + ple
    per_token = 3 * stored_sliding + stored_full + shared_sliding + shared_full + h * 16 * 6
    shape = load_model_shape(MODELS / "gemma4-tiny")
    assert token_params(shape) == per_token == 970_752
    assert shape.last_stored == 3 and shape.lm_head == h * 256


def test_a_prefill_counts_causal_and_sliding_pairs_and_one_lm_head() -> None:
    shape = load_model_shape(MODELS / "gemma4-tiny")
    work = cell_work(shape, Workload(input_len=20, output_len=1, num_prompts=3, concurrency=2),
                     weight_itemsize=4, kv_itemsize=4)
    sliding_pairs = 16 * 17 // 2 + 4 * 16                   # window 16: min(p, 16) for p = 1..20
    full_pairs = 20 * 21 // 2
    attention = 4 * 4 * (32 * sliding_pairs * 4 + 64 * full_pairs * 2)   # 4 sliding and 2 full layers
    per_request = 2 * 20 * token_params(shape) + attention + 2 * shape.lm_head
    assert work.prefill_flops == 3 * per_request and work.decode_flops == 0
    assert work.decode_steps == 0 and work.kv_bytes == 0
    assert work.weight_bytes == 4 * shape.weights            # read at least once


def test_decode_steps_are_bounded_by_concurrency_and_by_each_requests_own_length() -> None:
    assert Workload(512, 128, num_prompts=256, concurrency=256).decode_steps == 127
    assert Workload(512, 128, num_prompts=512, concurrency=256).decode_steps == 254
    assert Workload(512, 1, num_prompts=512, concurrency=256).decode_steps == 0


def test_the_least_work_skips_only_what_feeds_no_stored_key() -> None:
    shape = load_model_shape(MODELS / "gemma4-e2b-dummy")
    one = cell_work(shape, Workload(1, 8, 4, 4), weight_itemsize=2, kv_itemsize=2)
    assert one.min_flops == one.flops                       # a one-token prompt: its only token is sampled
    long = cell_work(shape, Workload(2048, 1, 4, 4), weight_itemsize=2, kv_itemsize=2)
    # an unsampled prompt token runs layers 0..13 and layer 14's k/v: about 0.31 of what vLLM runs by default
    assert 0.25 < long.min_flops / long.flops < 0.35


def test_an_unknown_architecture_is_refused_by_name(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}))
    with pytest.raises(UnknownArchitecture, match="LlamaForCausalLM"):
        load_model_shape(tmp_path)
    served = served_model(tmp_path, {"dtype": "bfloat16"})
    assert served.shape is None and "LlamaForCausalLM" in served.omitted and "omitted" in served.omitted


def test_a_gemma4_this_count_would_get_wrong_is_refused(tmp_path: Path) -> None:
    config = json.loads((MODELS / "gemma4-tiny" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_experts": 8, "enable_moe_block": True}))
    with pytest.raises(UnknownArchitecture, match="mixture-of-experts"):
        load_model_shape(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "layer_types": ["sliding_attention"] * 5}))
    with pytest.raises(RooflineUnavailable, match="layer_types"):
        load_model_shape(tmp_path)


def test_dtypes_give_their_element_size_and_an_unknown_one_is_refused() -> None:
    assert dtype_bytes("float32") == 4 and dtype_bytes("auto", fallback="bfloat16") == 2
    assert dtype_bytes("fp8_e4m3") == 1 and dtype_bytes("auto") == 2
    with pytest.raises(RooflineUnavailable, match="int3"):
        dtype_bytes("int3")
