"""The `search` proposer: no LLM. Points of an engine-arg space, each expressed as a patch to the
workspace's serving.yaml, so they pass the same gate, verification and audit as any code patch.

Stateless: what was tried is read from the history (`HistoryEntry.source`), so a resumed campaign
continues the same search. `random`: one-coordinate moves from the incumbent first (in a seeded random
order), then the rest of the space; `grid`: the whole space in its natural order.
"""

from __future__ import annotations

import difflib
import itertools
import json
import random
from collections.abc import Iterator, Mapping

import yaml

from agent.base import CampaignState, GiveUp, Proposal, Tools
from agent.spec import SearchConfig

__all__ = ["SearchProposer", "serving_diff"]

SERVING_FILE = "serving.yaml"
# Why each knob could matter on vLLM, and a rough prior for the prediction that is recorded.
_RATIONALE: dict[str, tuple[str, float]] = {
    "enforce_eager": ("torch.compile traces the Gemma 4 forward and fuses element-wise ops; on CPU this "
                      "cuts per-step overhead in decode", 1.15),
    "max_num_seqs": ("the scheduler's batch cap: more sequences per step amortise per-step overhead, "
                     "fewer reduce padding and memory pressure", 1.05),
    "max_num_batched_tokens": ("the token budget per step bounds prefill chunking and the decode batch",
                               1.05),
    "enable_chunked_prefill": ("chunked prefill interleaves prefill with decode; off lets long prompts run "
                               "in one step", 1.03),
    "async_scheduling": ("overlaps scheduling of step n+1 with execution of step n", 1.05),
    "block_size": ("the KV-cache page size changes attention's gather pattern", 1.02),
}


def serving_diff(old_text: str, new_text: str) -> str:
    lines = list(difflib.unified_diff(old_text.splitlines(keepends=True), new_text.splitlines(keepends=True),
                                      fromfile=f"a/{SERVING_FILE}", tofile=f"b/{SERVING_FILE}"))
    return f"diff --git a/{SERVING_FILE} b/{SERVING_FILE}\n" + "".join(lines) if lines else ""


def _key(point: Mapping[str, object]) -> str:
    return json.dumps(dict(sorted(point.items())), sort_keys=True)


class SearchProposer:
    name = "search"

    def __init__(self, config: SearchConfig) -> None:
        self.config = config

    def _points(self, incumbent: Mapping[str, object], rng: random.Random) -> Iterator[dict[str, object]]:
        space = self.config.space
        if self.config.strategy == "random":
            moves = [{k: v} for k, values in space.items() for v in values if incumbent.get(k) != v]
            rng.shuffle(moves)
            for move in moves:
                yield {**incumbent, **move}
        keys = sorted(space)
        rest = [dict(zip(keys, values, strict=True)) for values in itertools.product(*(space[k] for k in keys))]
        if self.config.strategy == "random":
            rng.shuffle(rest)
        for point in rest:
            yield {**incumbent, **point}

    def propose(self, state: CampaignState, tools: Tools, *, rng: random.Random) -> Proposal | GiveUp:
        # The baseline was measured already: going back to it is not a new point.
        tried = {entry.source for entry in state.history} | {f"search:{_key(state.baseline_serving_config)}"}
        incumbent = dict(state.serving_config)
        # Seeded by the campaign seed and iteration only: a resumed campaign proposes the same point.
        local = random.Random(f"{self.config.seed}:{state.iteration}")
        for point in self._points(incumbent, local):
            changes = {k: v for k, v in point.items() if incumbent.get(k) != v}
            source = f"search:{_key(point)}"
            if not changes or source in tried:
                continue
            old_text = tools.read_file(SERVING_FILE)
            patch = serving_diff(old_text, yaml.safe_dump(point, sort_keys=True))
            reasons = [f"{k}: {incumbent.get(k, 'default')} -> {v} ({_RATIONALE.get(k, ('engine arg', 1.0))[0]})"
                       for k, v in changes.items()]
            predicted = 1.0
            for k in changes:
                predicted *= _RATIONALE.get(k, ("", 1.02))[1]
            hypothesis = ("Serving config change expected to raise end-to-end and prefill throughput on all cells: "
                          + "; ".join(reasons))
            return Proposal(hypothesis=hypothesis, patch=patch, predicted_speedup=round(predicted, 3),
                            target_cells=(), source=source)
        return GiveUp(reason=f"search space exhausted ({len(tried)} points tried)")
