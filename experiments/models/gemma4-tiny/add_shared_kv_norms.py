"""Make a copy of this checkpoint loadable by vLLM <= 0.26 (the H200's vLLM): those versions create a
k_norm weight on KV-shared layers too and refuse a checkpoint without one; transformers 5.19 does not save
it, because a KV-shared layer reads the keys of an earlier layer and never uses its own k_norm. The weight
added is that earlier layer's, so even a loader that did use it would compute the same keys.

    python experiments/models/gemma4-tiny/add_shared_kv_norms.py DIR    # rewrites DIR/model.safetensors
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file


def add_shared_kv_norms(model_dir: Path) -> list[str]:
    config = json.loads((model_dir / "config.json").read_text())
    types = config["layer_types"]
    first_shared = len(types) - config["num_kv_shared_layers"]
    weights = load_file(str(model_dir / "model.safetensors"))
    added = []
    for layer in range(first_shared, len(types)):
        name = f"model.layers.{layer}.self_attn.k_norm.weight"
        if name in weights:
            continue
        # the KV source: the last non-shared layer of the same attention type
        source = max(i for i in range(first_shared) if types[i] == types[layer])
        weights[name] = weights[f"model.layers.{source}.self_attn.k_norm.weight"].clone()
        added.append(name)
    if added:
        save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    return added


if __name__ == "__main__":
    print("added:", add_shared_kv_norms(Path(sys.argv[1])) or "nothing")
