"""The served roofline: what one grid cell asks of the hardware, counted from the model's config.

A cell is `num_prompts` requests of `input_len` prompt tokens and `output_len` generated tokens, at most
`concurrency` in flight. Its work, counted as vLLM's Gemma 4 (`vllm/model_executor/models/gemma4.py`) multiplies:

- per token and layer: the attention projections (q, k, v, o; a KV-shared layer has q and o only: its keys and
  values come from an earlier layer's cache), the MLP (gate, up, down; twice as wide on KV-shared layers with
  `use_double_wide_mlp`) and the per-layer-embedding gate and projection; per token once: the PLE model projection
  (hidden -> layers x PLE width). The embedding look-ups are gathers, not products, and are not counted;
- attention: 4 x query heads x head dim FLOPs per (query, visible key) pair (scores and the weighted sum), a key
  visible when it is at or before the query and, on a sliding layer, fewer than `sliding_window` positions back;
- the lm_head (hidden x vocab) once per sampled token: the last prompt token of each request and every decode step.

Two FLOP counts, because one of them is what the floor may use:
- `flops`: as vLLM serves by default, every layer on every prompt token. MFU is reported on it.
- `min_flops`: what any exact implementation must do. A prompt token whose logits are not sampled only has to feed
  the keys and values later tokens read: the layers before the last one that stores K/V, and that layer's k/v
  projection. vLLM's own `kv_sharing_fast_prefill` (YOCO) skips the KV-shared layers for such tokens, so a change
  that turns it on is a real gain and must never be called impossible. The floor uses this count.

Bytes (a lower bound): the weights that are multiplied, read once per decode step (at least once per cell); the
keys and values each decode step reads, once per layer that stores them (the KV-shared layers read them again: not
counted). Not counted: activations, KV writes, embedding rows, re-reads. A decode step at the benchmark's
concurrency cannot retain more than the device's caches between steps, so `cache_bytes` per step is taken off.

The floor of a cell is max(min_flops / matmul rate, bytes / bandwidth): the phases (prefill, decode) are not
summed separately, since vLLM's chunked prefill runs decode tokens in the same steps as prompt chunks, where one
read of the weights serves both. It assumes one token per request per decode step (no speculative decoding) and
no prefix cache (the harness serves fresh prompts with it off); a result beyond it skipped or miscounted tokens.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import RooflineUnavailable, UnknownArchitecture

__all__ = ["Layer", "ModelShape", "Workload", "Work", "model_shape", "load_model_shape", "token_params",
           "cell_work", "dtype_bytes", "KNOWN_ARCHITECTURES"]

KNOWN_ARCHITECTURES = ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration")
_MODEL_TYPES = ("gemma4", "gemma4_text")
_LAYER_TYPES = {"sliding_attention", "full_attention"}
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}     # and every fp8*: 1


@dataclass(frozen=True)
class Layer:
    q_heads: int
    kv_heads: int
    head_dim: int
    window: int | None        # sliding window (keys visible per query); None: full attention
    intermediate: int         # MLP width of this layer
    stores_kv: bool           # False: a KV-shared layer (q and o only; reads an earlier layer's cache)
    ple: int                  # per-layer-embedding width (0: none)

    def kv_params(self, hidden: int) -> int:
        return hidden * 2 * self.kv_heads * self.head_dim if self.stores_kv else 0

    def params(self, hidden: int) -> int:
        """Weights multiplied per token in this layer."""
        q_and_o = 2 * hidden * self.q_heads * self.head_dim
        mlp = 3 * hidden * self.intermediate        # gate and up (merged), down
        return q_and_o + self.kv_params(hidden) + mlp + 2 * hidden * self.ple

    def keys(self, position: int) -> int:
        """Keys visible to the query at 1-based `position`."""
        return position if self.window is None else min(position, self.window)

    def keys_sum(self, first: int, last: int) -> int:
        """Sum of `keys(p)` for p in first..last (0 when last < first)."""
        def upto(n: int) -> int:
            if n <= 0:
                return 0
            w = n if self.window is None else min(n, self.window)
            return w * (w + 1) // 2 + (n - w) * w
        return upto(last) - upto(first - 1)

    def attention_flops(self, keys: int) -> int:
        return 4 * self.q_heads * self.head_dim * keys

    def kv_bytes_per_key(self, itemsize: int) -> int:
        return 2 * self.kv_heads * self.head_dim * itemsize if self.stores_kv else 0


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    hidden: int
    vocab: int
    layers: tuple[Layer, ...]

    @property
    def ple_projection(self) -> int:
        """The PLE model projection's weights (hidden -> layers x PLE width), multiplied once per token."""
        return self.hidden * sum(layer.ple for layer in self.layers)

    @property
    def lm_head(self) -> int:
        return self.hidden * self.vocab

    @property
    def last_stored(self) -> int:
        """Index of the last layer that stores keys and values."""
        return max(i for i, layer in enumerate(self.layers) if layer.stores_kv)

    @property
    def weights(self) -> int:
        """Every weight a decode step multiplies: all layers, the PLE projection, the lm_head."""
        return token_params(self) + self.lm_head


def token_params(shape: ModelShape) -> int:
    """Weights multiplied per token, lm_head and attention left out (2 FLOPs each): the issue's "per token"."""
    return sum(layer.params(shape.hidden) for layer in shape.layers) + shape.ple_projection


def _require(cfg: Mapping[str, Any], key: str, where: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise RooflineUnavailable(f"{where}: {key} is {value!r}, not a positive integer; the roofline is omitted")
    return value


def _check_architecture(cfg: Mapping[str, Any], where: str) -> str:
    archs = [str(a) for a in cfg.get("architectures") or []]
    known = [a for a in archs if a in KNOWN_ARCHITECTURES]
    model_type = str(cfg.get("model_type") or "")
    if not known and model_type not in _MODEL_TYPES:
        name = ", ".join(archs) or model_type or "no architecture named"
        raise UnknownArchitecture(f"{where}: architecture {name} is not one the served roofline counts (it counts "
                                  f"{', '.join(KNOWN_ARCHITECTURES)}); the roofline is omitted, not guessed")
    return known[0] if known else model_type


def _layer_heads(text: Mapping[str, Any], index: int, kind: str, where: str) -> tuple[int, int]:
    """(head_dim, kv_heads) of one layer, as transformers' Gemma4TextConfig resolves them."""
    head_dim, kv = _require(text, "head_dim", where), _require(text, "num_key_value_heads", where)
    overrides = text.get("per_layer_config")
    if isinstance(overrides, Mapping):   # keys as transformers reads them: int("04") is layer 4
        own = {int(k): v for k, v in overrides.items()}.get(index) or {}
        return int(own.get("head_dim", head_dim)), int(own.get("num_key_value_heads", kv))
    if kind == "full_attention":
        if "global_head_dim" not in text:
            raise RooflineUnavailable(f"{where}: neither global_head_dim nor per_layer_config: the full-attention "
                                      "layers' head dim is not in the file; the roofline is omitted")
        full_kv = text.get("num_global_key_value_heads") if text.get("attention_k_eq_v") else None
        return _require(text, "global_head_dim", where), int(full_kv or kv)
    return head_dim, kv


def model_shape(cfg: Mapping[str, Any], *, where: str = "config.json") -> ModelShape:
    """The shapes vLLM multiplies for a Gemma 4 config (a nested `text_config` is read as vLLM reads it).
    Anything else is refused by name (`UnknownArchitecture`), and so is a Gemma 4 this count would get wrong."""
    architecture = _check_architecture(cfg, where)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), Mapping) else cfg
    assert isinstance(text, Mapping)
    if text.get("enable_moe_block") or text.get("num_experts"):
        raise UnknownArchitecture(f"{where}: {architecture} with a mixture-of-experts block (num_experts "
                                  f"{text.get('num_experts')}) is not counted; the roofline is omitted")
    if cfg.get("quantization_config") or text.get("quantization_config"):
        raise UnknownArchitecture(f"{where}: {architecture} with quantized weights is not counted; the roofline "
                                  "is omitted")
    n = _require(text, "num_hidden_layers", where)
    kinds = list(text.get("layer_types") or [])
    if len(kinds) != n or set(kinds) - _LAYER_TYPES:
        raise RooflineUnavailable(f"{where}: layer_types {kinds!r} are not {n} of {sorted(_LAYER_TYPES)}; the "
                                  "roofline is omitted")
    hidden, heads = _require(text, "hidden_size", where), _require(text, "num_attention_heads", where)
    first_shared = n - int(text.get("num_kv_shared_layers") or 0)
    ple = int(text.get("hidden_size_per_layer_input") or 0)
    layers = []
    for i, kind in enumerate(kinds):
        head_dim, kv = _layer_heads(text, i, kind, where)
        shared = i >= first_shared > 0       # as vLLM's Gemma4DecoderLayer decides
        wide = 2 if shared and text.get("use_double_wide_mlp") else 1
        layers.append(Layer(q_heads=heads, kv_heads=kv, head_dim=head_dim,
                            window=_require(text, "sliding_window", where) if kind == "sliding_attention" else None,
                            intermediate=_require(text, "intermediate_size", where) * wide,
                            stores_kv=not shared, ple=ple))
    return ModelShape(architecture=architecture, hidden=hidden, vocab=_require(text, "vocab_size", where),
                      layers=tuple(layers))


def load_model_shape(path: Path) -> ModelShape:
    """`path`: a checkpoint directory or its config.json."""
    file = path / "config.json" if path.is_dir() else path
    try:
        cfg = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise RooflineUnavailable(f"{file}: not readable as a model config ({exc}); the roofline is omitted") from None
    if not isinstance(cfg, dict):
        raise RooflineUnavailable(f"{file}: not a JSON object; the roofline is omitted")
    return model_shape(cfg, where=str(file))


def dtype_bytes(dtype: object, *, fallback: object = None) -> int:
    """Bytes per element of a vLLM dtype name ("auto" takes `fallback`, the checkpoint's or the model's)."""
    name = str(dtype or "auto").removeprefix("torch.")
    if name == "auto":
        name = str(fallback or "bfloat16").removeprefix("torch.")
    if name.startswith("fp8"):
        return 1
    if name in DTYPE_BYTES:
        return DTYPE_BYTES[name]
    raise RooflineUnavailable(f"dtype {dtype!r} has no known element size; the roofline is omitted")


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    num_prompts: int
    concurrency: int

    @property
    def tokens(self) -> int:
        """What total tok/s counts: every prompt and generated token."""
        return self.num_prompts * (self.input_len + self.output_len)

    @property
    def decode_steps(self) -> int:
        """The fewest decode steps: each request generates output_len - 1 tokens after its prefill, one per step,
        at most `concurrency` requests per step."""
        per_request = self.output_len - 1
        if per_request <= 0:
            return 0
        return max(per_request, math.ceil(self.num_prompts * per_request / self.concurrency))


@dataclass(frozen=True)
class Work:
    prefill_flops: float      # as vLLM serves by default (every layer on every prompt token), lm_head included
    decode_flops: float
    min_flops: float          # what an exact implementation must multiply (module docstring)
    weight_bytes: float       # weights read: once per decode step, at least once
    kv_bytes: float           # keys and values read by the decode steps
    decode_steps: int

    @property
    def flops(self) -> float:
        return self.prefill_flops + self.decode_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes

    def floor_bytes(self, cache_bytes: float) -> float:
        """Bytes that must cross the memory bus: what a step re-reads beyond what the caches can keep."""
        return max(0.0, self.bytes - max(1, self.decode_steps) * cache_bytes)


def _prefill(shape: ModelShape, length: int) -> tuple[int, int]:
    """(FLOPs as served, minimal FLOPs) of one request's prefill of `length` tokens; its last token is sampled."""
    h = shape.hidden
    served = 2 * length * token_params(shape) + 2 * shape.lm_head
    served += sum(layer.attention_flops(layer.keys_sum(1, length)) for layer in shape.layers)
    s = shape.last_stored
    feeding = shape.layers[:s]                      # what an unsampled prompt token must run through
    unsampled = 2 * (sum(layer.params(h) for layer in feeding) + shape.layers[s].kv_params(h) + shape.ple_projection)
    minimal = (length - 1) * unsampled + sum(layer.attention_flops(layer.keys_sum(1, length - 1)) for layer in feeding)
    minimal += 2 * token_params(shape) + 2 * shape.lm_head
    minimal += sum(layer.attention_flops(layer.keys(length)) for layer in shape.layers)
    return served, minimal


def cell_work(shape: ModelShape, load: Workload, *, weight_itemsize: int, kv_itemsize: int) -> Work:
    prefill, prefill_min = _prefill(shape, load.input_len)
    steps = load.output_len - 1                    # decode steps of one request; context input_len + j at step j
    first, last = load.input_len + 1, load.input_len + steps
    decode = 2 * steps * shape.weights + sum(layer.attention_flops(layer.keys_sum(first, last))
                                             for layer in shape.layers)
    # each step reads the keys written before it: contexts input_len .. input_len + steps - 1
    kv = sum(layer.kv_bytes_per_key(kv_itemsize) * layer.keys_sum(first - 1, last - 1) for layer in shape.layers)
    n = load.num_prompts
    return Work(prefill_flops=float(n * prefill), decode_flops=float(n * decode),
                min_flops=float(n * (prefill_min + decode)),
                weight_bytes=float(max(1, load.decode_steps) * shape.weights * weight_itemsize),
                kv_bytes=float(n * kv), decode_steps=load.decode_steps)
