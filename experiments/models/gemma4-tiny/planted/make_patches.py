"""Regenerate the planted-bug patches against the installed vLLM (paths relative to site-packages).

    .venv/bin/python experiments/models/gemma4-tiny/planted/make_patches.py [--check]

Each bug is one textual edit of vllm/model_executor/models/gemma4.py; the diff is written
git-style (a/ b/ prefixes) so `git apply` runs from the site-packages root (or from a copy of the
package tree). --check only verifies that every edit still finds its anchor (vLLM upgrades).
Each patch's transformers mirror lives in ../reference.py (BUGS).
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = "vllm/model_executor/models/gemma4.py"

# name -> (anchor, replacement); each anchor must occur exactly once in the installed file.
EDITS: dict[str, tuple[str, str]] = {
    "sliding-window-halved": (
        "        sliding_window = config.sliding_window if self.is_sliding else None\n",
        "        sliding_window = config.sliding_window // 2 if self.is_sliding else None\n",
    ),
    "ple-scale-changed": (
        "                torch.tensor(self.hidden_size_per_layer_input**0.5),\n",
        "                torch.tensor(float(config.hidden_size)),\n",
    ),
    "norm-skipped": (
        "        hidden_states = self.post_feedforward_layernorm(hidden_states)\n",
        "",
    ),
    "full-rope-theta-changed": (
        "            rope_parameters = dict(config.rope_parameters[layer_type])\n",
        "            rope_parameters = dict(config.rope_parameters[layer_type])\n"
        "            if not self.is_sliding:\n"
        "                rope_parameters[\"rope_theta\"] = 10000.0\n",
    ),
}


def site_packages() -> Path:
    import vllm

    return Path(vllm.__file__).resolve().parents[1]


def make_patch(source: str, anchor: str, replacement: str) -> str:
    if source.count(anchor) != 1:
        raise SystemExit(f"anchor found {source.count(anchor)} times in {TARGET}: {anchor!r}; "
                         "update EDITS for this vLLM version")
    edited = source.replace(anchor, replacement)
    body = difflib.unified_diff(source.splitlines(keepends=True), edited.splitlines(keepends=True),
                                fromfile=f"a/{TARGET}", tofile=f"b/{TARGET}", n=3)
    return f"diff --git a/{TARGET} b/{TARGET}\n" + "".join(body)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    src = (site_packages() / TARGET).read_text()
    for name, (anchor, repl) in EDITS.items():
        patch = make_patch(src, anchor, repl)
        if not args.check:
            (HERE / f"{name}.patch").write_text(patch)
        print(f"{name}: ok")
