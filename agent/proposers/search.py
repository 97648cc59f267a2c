"""The `search` proposer: no LLM. Points of an engine-arg space, each expressed as a patch to the
workspace's serving.yaml, so they pass the same gate, verification and audit as any code patch.

Stateless: what was tried is read from the history (`HistoryEntry.source`), so a resumed campaign
continues the same search. `random`: one-coordinate moves from the incumbent first (in a seeded random
order), then the rest of the space; `ordered`: the same, in the order the spec writes its keys and values (where
a round of a few candidates on a GPU should try the author's likeliest moves first); `grid`: the whole space in
its natural order.

With a profile (the spec's `profile_baseline: true`; the search itself does not ask for one, since it costs a
server start), each hypothesis cites the part of the incumbent's median engine step its knobs act on
(`CampaignState.profile_steps`, harness/step_profile.py): CPU time between GPU work for async scheduling and the
streaming knobs, launch gaps for the CUDA-graph ones, the prefill step for the token budget. It does not reorder
the search: a resumed campaign proposes the same points.

No no-ops: a point whose every change only sets a value already in force (`state.effective_serving_config`,
vLLM's resolution of the incumbent's engine args, falling back to `state.serving_config`) is skipped, e.g.
`enable_chunked_prefill: true` on vLLM V1, where it is the default. A point that also changes something
else is kept as written: other defaults can move with it (chunked prefill off raises vLLM's default
max_num_batched_tokens to max_model_len), so pinning the old value is a real change.
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
    "long_prefill_token_threshold": ("caps the tokens one long prompt takes per step, so decodes and short "
                                     "prefills are not starved behind it", 1.02),
    "cudagraph_mode": ("which steps replay CUDA graphs (decode only, mixed, piecewise): fewer launches per step, "
                       "at a capture cost paid at start-up", 1.03),
    "max_cudagraph_capture_size": ("the largest step replayed from a CUDA graph; larger steps run without one",
                                   1.02),
    "stream_interval": ("tokens sent per streamed chunk: the API server detokenises and sends once per N tokens "
                        "instead of every token, which many concurrent streams of a small model can be bound by",
                        1.03),
    "api_server_count": ("API-server processes in front of one engine: the per-token work of many concurrent "
                         "streams (detokenising, JSON, HTTP) spread over several cores instead of one", 1.05),
}


# The part of a step each knob acts on: the phase whose median step is cited, and its rows.
_ACTS_ON: dict[str, tuple[str, tuple[str, ...]]] = {
    "async_scheduling": ("decode", ("CPU time between GPU work",)),
    "stream_interval": ("decode", ("CPU time between GPU work", "host ops while GPU idle")),
    "api_server_count": ("decode", ("CPU time between GPU work", "host ops while GPU idle")),
    "cudagraph_mode": ("decode", ("launch gaps", "CPU time between GPU work")),
    "max_cudagraph_capture_size": ("mixed", ("launch gaps", "CPU time between GPU work")),
    "enforce_eager": ("decode", ("launch gaps", "host time outside ops")),
    "max_num_seqs": ("decode", ("GPU busy", "GPU idle")),
    "max_num_batched_tokens": ("prefill", ("GPU busy", "GPU idle")),
    "long_prefill_token_threshold": ("mixed", ("GPU busy", "GPU idle")),
    "enable_chunked_prefill": ("prefill", ("GPU busy", "GPU idle")),
}


def serving_diff(old_text: str, new_text: str) -> str:
    lines = list(difflib.unified_diff(old_text.splitlines(keepends=True), new_text.splitlines(keepends=True),
                                      fromfile=f"a/{SERVING_FILE}", tofile=f"b/{SERVING_FILE}"))
    return f"diff --git a/{SERVING_FILE} b/{SERVING_FILE}\n" + "".join(lines) if lines else ""


def _key(point: Mapping[str, object]) -> str:
    return json.dumps(dict(sorted(point.items())), sort_keys=True)


class SearchProposer:
    name = "search"
    reads_profile = False

    def __init__(self, config: SearchConfig) -> None:
        self.config = config

    def _points(self, incumbent: Mapping[str, object], rng: random.Random) -> Iterator[dict[str, object]]:
        space = self.config.space
        one_at_a_time = self.config.strategy in ("random", "ordered")
        if one_at_a_time:
            moves = [{k: v} for k, values in space.items() for v in values if incumbent.get(k) != v]
            if self.config.strategy == "random":
                rng.shuffle(moves)
            for move in moves:
                yield {**incumbent, **move}
        keys = sorted(space) if self.config.strategy != "ordered" else list(space)
        rest = [dict(zip(keys, values, strict=True)) for values in itertools.product(*(space[k] for k in keys))]
        if self.config.strategy == "random":
            rng.shuffle(rest)
        for point in rest:
            yield {**incumbent, **point}

    def propose(self, state: CampaignState, tools: Tools, *, rng: random.Random) -> Proposal | GiveUp:
        # The baseline was measured already: going back to it is not a new point.
        tried = {entry.source for entry in state.history} | {f"search:{_key(state.baseline_serving_config)}"}
        incumbent = dict(state.serving_config)
        effective = {**incumbent, **state.effective_serving_config}
        noops: set[str] = set()
        # Seeded by the campaign seed and iteration only: a resumed campaign proposes the same point.
        local = random.Random(f"{self.config.seed}:{state.iteration}")
        for point in self._points(incumbent, local):
            changes = {k: v for k, v in point.items() if incumbent.get(k) != v}
            source = f"search:{_key(point)}"
            if not changes or source in tried:
                continue
            if all(_in_force(effective, k, v) for k, v in changes.items()):
                noops.add(", ".join(f"{k}={v}" for k, v in sorted(changes.items())))
                continue
            old_text = tools.read_file(SERVING_FILE)
            patch = serving_diff(old_text, yaml.safe_dump(point, sort_keys=True))
            reasons = [f"{_move(k, v, incumbent, effective)} ({_RATIONALE.get(k, ('engine arg', 1.0))[0]})"
                       for k, v in changes.items()]
            predicted = 1.0
            for k, v in changes.items():
                if not _in_force(effective, k, v):
                    predicted *= _RATIONALE.get(k, ("", 1.02))[1]
            hypothesis = ("Serving config change expected to raise end-to-end and prefill throughput on all cells: "
                          + "; ".join(reasons) + _measured(changes, state.profile_steps))
            return Proposal(hypothesis=hypothesis, patch=patch, predicted_speedup=round(predicted, 3),
                            target_cells=(), source=source)
        if noops:
            listed = "; ".join(sorted(noops)[:6]) + ("; ..." if len(noops) > 6 else "")
            return GiveUp(reason=f"search space exhausted ({len(tried)} points tried): the {len(noops)} points left "
                                 f"are no-ops, their values already in force in vLLM's effective config ({listed})")
        return GiveUp(reason=f"search space exhausted ({len(tried)} points tried)")


def _measured(changes: Mapping[str, object], steps: Mapping[str, Mapping[str, float]]) -> str:
    """`. Measured on the incumbent (median step): decode 9120 µs, CPU time between GPU work 2310 µs (25%)`, or
    nothing without a profile."""
    parts: list[str] = []
    for key in changes:
        phase, rows = _ACTS_ON.get(key, ("decode", ("GPU idle",)))
        phase = phase if phase in steps else "decode"
        table = steps.get(phase) or {}
        wall = table.get("wall")
        if not wall:
            continue
        cited = ", ".join(f"{row} {table[row]:.0f} µs ({table[row] / wall:.0%})" for row in rows if row in table)
        text = f"{phase} {wall:.0f} µs" + (f", {cited}" if cited else "")
        if text not in parts:
            parts.append(text)
    return ". Measured on the incumbent (median step): " + "; ".join(parts) if parts else ""


def _in_force(effective: Mapping[str, object], key: str, value: object) -> bool:
    """`value` is what vLLM already runs with for `key` (unknown keys are never in force)."""
    if key not in effective:
        return False
    current = effective[key]
    return isinstance(current, bool) == isinstance(value, bool) and current == value


def _move(key: str, value: object, incumbent: Mapping[str, object], effective: Mapping[str, object]) -> str:
    """`max_num_seqs: 128 (vLLM default) -> 32`: the value in force the point moves away from."""
    if key in incumbent:
        old = f"{incumbent[key]}"
        if key in effective and not _in_force(incumbent, key, effective[key]):
            old += f" (vLLM resolves {effective[key]})"
    elif key in effective:
        old = f"{effective[key]} (vLLM default)"
    else:
        old = "default"
    pinned = " (pinned: already in force)" if _in_force(effective, key, value) else ""
    return f"{key}: {old} -> {value}{pinned}"
