"""Write the planted bugs of the E2B-shaped checkpoint as patches against vLLM 0.26's gemma4.py (the GPU host's
vLLM). Each is a change a parity check on E2B's shapes must catch; none of them fails to start or crash.

    python3 make_patches.py SITE_OR_WHEEL_DIR    # a folder holding vllm/model_executor/models/gemma4.py

long-context-mlp-skip.patch  the MLP of every other layer returns zeros at positions >= 4,096 (only the
                             grid's 8,192-token cells reach them), written without data-dependent shapes so
                             that torch.compile and CUDA graphs take it
ple-scale-10pct.patch        the PLE token table's scale is 10 % larger (a subtle numeric change)
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REL = "vllm/model_executor/models/gemma4.py"

EDITS = {
    "long-context-mlp-skip.patch": (
        "        hidden_states = self.pre_feedforward_layernorm(hidden_states)\n"
        "        hidden_states = self.mlp(hidden_states)\n",
        "        hidden_states = self.pre_feedforward_layernorm(hidden_states)\n"
        "        hidden_states = self.mlp(hidden_states)\n"
        "        if self.layer_idx % 2 == 1:\n"
        "            # \"long-context fast path\": no MLP on every other layer past position 4096\n"
        "            hidden_states = torch.where((positions < 4096).unsqueeze(-1), hidden_states, 0.0)\n"),
    "ple-scale-10pct.patch": (
        "                torch.tensor(self.hidden_size_per_layer_input**0.5),\n",
        "                torch.tensor(1.1 * self.hidden_size_per_layer_input**0.5),\n"),
}


def main(root: Path) -> None:
    text = (root / REL).read_text()
    for name, (old, new) in EDITS.items():
        if text.count(old) != 1:
            raise SystemExit(f"{name}: the text to change occurs {text.count(old)} times in {root / REL}")
        lines = difflib.unified_diff(text.splitlines(True), text.replace(old, new).splitlines(True),
                                     fromfile=f"a/{REL}", tofile=f"b/{REL}")
        (HERE / name).write_text(f"diff --git a/{REL} b/{REL}\n" + "".join(lines))
        print("wrote", HERE / name)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
