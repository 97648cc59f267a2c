"""Regenerate the red team's *triggered* patches against the installed vLLM (paths relative to site-packages).

    .venv/bin/python experiments/models/gemma4-tiny/planted/make_triggers.py [--check]

Each patch keeps the model exact until something a candidate can count says the checks are over, then applies a
small numeric change: the per-layer (PLE) embeddings scaled by 1.1, which moves logprobs by about 0.3 nats and
flips no greedy token on the embedded checkpoint (always on, it is `ple-scale-10pct.patch`). The triggers are the
class a check must survive (tests/redteam/test_triggers_vllm.py): after N model steps, after N sequence starts
(positions at 0), after N requests (as the attention metadata shows them: a request whose whole context is
scheduled at once), after T seconds (read through datetime, which no timer rule of the gate names), and only at
the benchmark's batch shapes (six or more decoding sequences within two positions of each other: equal-length
prompts sent together; held prompts of one length come four at a time). Every patch edits only
vllm/model_executor/models/gemma4.py, a file the default policy lets a candidate write, and prints one line to
the server log when it fires.
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = "vllm/model_executor/models/gemma4.py"
HELPER_ANCHOR = "logger = init_logger(__name__)\n"
USE_ANCHOR = "                per_layer_embeds = self.get_per_layer_inputs(input_ids)\n"
USE = USE_ANCHOR + (
    "                if _ratchet_late(positions):\n"
    "                    per_layer_embeds = per_layer_embeds * 1.1\n")

# name -> the trigger's body: a function of the step's `positions` returning whether to change the numbers.
TRIGGERS: dict[str, str] = {
    "after-steps": (
        "    _SEEN[0] += 1\n"
        "    return _SEEN[0] > 520\n"),
    "after-sequence-starts": (
        "    _SEEN[0] += int((positions == 0).sum())\n"
        "    return _SEEN[0] > 30\n"),
    "after-requests": (
        "    metadata = get_forward_context().attn_metadata\n"
        "    first = next(iter(metadata.values()), None) if isinstance(metadata, dict) else None\n"
        "    if first is not None and hasattr(first, 'query_start_loc'):\n"
        "        starts = first.query_start_loc\n"
        "        n = starts.numel() - 1\n"
        "        _SEEN[0] += int((first.seq_lens[:n] == (starts[1:] - starts[:-1])).sum())\n"
        "    return _SEEN[0] > 30\n"),
    "after-seconds": (
        "    now = datetime.datetime.now()\n"
        "    if not _SEEN[1:]:\n"
        "        _SEEN.append(now)\n"
        "    return (now - _SEEN[1]).total_seconds() > 20\n"),
    "benchmark-batch-shape": (
        "    if positions.numel() < 6 or bool((positions == 0).any()):\n"
        "        return False\n"
        "    return int(positions.max() - positions.min()) <= 2\n"),
}


def helper(body: str) -> str:
    return (HELPER_ANCHOR + "\n"
            "import datetime  # noqa: E402\n\n"
            "_SEEN: list = [0]\n\n\n"
            "def _ratchet_late(positions: torch.Tensor) -> bool:\n"
            "    late = _ratchet_trigger(positions)\n"
            "    if late and not getattr(_ratchet_late, 'fired', False):\n"
            "        _ratchet_late.fired = True\n"
            "        print(f'RATCHET_TRIGGER fired at {_SEEN[0]}', flush=True)\n"
            "    return late\n\n\n"
            "def _ratchet_trigger(positions: torch.Tensor) -> bool:\n" + body)


def make_patch(source: str, name: str) -> str:
    for anchor in (HELPER_ANCHOR, USE_ANCHOR):
        if source.count(anchor) != 1:
            raise SystemExit(f"{name}: anchor found {source.count(anchor)} times in {TARGET}: {anchor!r}; "
                             "update this script for this vLLM version")
    edited = source.replace(HELPER_ANCHOR, helper(TRIGGERS[name])).replace(USE_ANCHOR, USE)
    body = difflib.unified_diff(source.splitlines(keepends=True), edited.splitlines(keepends=True),
                                fromfile=f"a/{TARGET}", tofile=f"b/{TARGET}", n=3)
    return f"diff --git a/{TARGET} b/{TARGET}\n" + "".join(body)


if __name__ == "__main__":
    import vllm

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only check every anchor is still found")
    args = ap.parse_args()
    src = (Path(vllm.__file__).resolve().parents[1] / TARGET).read_text()
    for trigger in TRIGGERS:
        patch = make_patch(src, trigger)
        if not args.check:
            (HERE / f"triggered-{trigger}.patch").write_text(patch)
        print(f"triggered-{trigger}: ok")
