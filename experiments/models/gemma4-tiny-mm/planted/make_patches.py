"""Regenerate the planted bugs of vLLM's Gemma 4 image path (paths relative to site-packages).

    .venv/bin/python experiments/models/gemma4-tiny-mm/planted/make_patches.py [--check]

Each bug is one textual edit of vllm/model_executor/models/gemma4_mm.py, the file a multimodal campaign may
change: where the vision tower's soft tokens are pooled, ordered and projected into the text model. The diffs
are git-style (a/ b/ prefixes) so `git apply` runs from a copy of the package tree. --check only verifies that
every edit still finds its anchor (vLLM upgrades).
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = "vllm/model_executor/models/gemma4_mm.py"

# name -> (anchor, replacement); each anchor must occur exactly once in the installed file.
EDITS: dict[str, tuple[str, str]] = {
    # The soft tokens of a picture in reverse order (a raster-order bug).
    "soft-tokens-reversed": (
        "            all_valid_states[orig_idx] = valid_states\n",
        "            all_valid_states[orig_idx] = valid_states.flip(0)\n",
    ),
    # Rows and columns of the soft-token grid swapped (a square picture's transpose).
    "soft-tokens-transposed": (
        "            all_valid_states[orig_idx] = valid_states\n",
        "            side = int(valid_states.shape[0] ** 0.5)\n"
        "            all_valid_states[orig_idx] = (\n"
        "                valid_states[: side * side].reshape(side, side, -1).transpose(0, 1).reshape(side * side, -1)\n"
        "            )\n",
    ),
    # The embedder's RMSNorm before the projection skipped: the image embeddings' scale changes.
    "embedder-norm-skipped": (
        "        embs_normed = self.embedding_pre_projection_norm(inputs_embeds)\n",
        "        embs_normed = inputs_embeds\n",
    ),
    # The projected image embeddings 10 % larger: the subtlest one (greedy tokens may hold; logprobs move).
    "image-embedding-scaled-10pct": (
        "        embs_proj, _ = self.embedding_projection(embs_normed)\n        return embs_proj\n",
        "        embs_proj, _ = self.embedding_projection(embs_normed)\n        return embs_proj * 1.1\n",
    ),
}


def installed_source() -> str:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    return (Path(spec.origin).parent.parent / TARGET).read_text()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    source = installed_source()
    for name, (anchor, replacement) in EDITS.items():
        if source.count(anchor) != 1:
            raise SystemExit(f"{name}: anchor found {source.count(anchor)} times in {TARGET}")
        if args.check:
            continue
        patched = source.replace(anchor, replacement)
        diff = difflib.unified_diff(source.splitlines(keepends=True), patched.splitlines(keepends=True),
                                    fromfile=f"a/{TARGET}", tofile=f"b/{TARGET}")
        (HERE / f"{name}.patch").write_text(f"diff --git a/{TARGET} b/{TARGET}\n" + "".join(diff))
        print(f"wrote {name}.patch")


if __name__ == "__main__":
    main()
