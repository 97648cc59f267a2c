"""The `search` proposer of kernel campaigns: points of a space of integer tunables (block sizes, warps,
pipeline stages, KV splits), each written as a patch to the kernel file's `NAME = value` lines, so it passes
the same gate, checks and audit as any code change.

Stateless like the engine-arg search: what was tried is read from the history (`HistoryEntry.source`).
`random`: single-tunable moves from the incumbent (seeded order), then whole points of the space in random
order; `grid`: the whole space in its natural order.
"""

from __future__ import annotations

import difflib
import itertools
import json
import random
import re
from collections.abc import Iterator, Mapping

from agent.base import CampaignState, GiveUp, Proposal, Tools
from agent.spec import SearchConfig

__all__ = ["KernelSearchProposer", "read_tunables", "write_tunables", "file_diff"]

_LINE = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*) = (?P<value>-?\d+)(?P<rest>[ \t]*(#.*)?)$", re.MULTILINE)

# Why a tunable could matter, by the suffix of its name, and a rough prior for the recorded prediction.
_RATIONALE: dict[str, tuple[str, float]] = {
    "_SPLITS": ("splitting each sequence's keys over more programs puts more of the SMs to work when "
                "batch x kv heads is small (decode: 64 programs for 132 SMs)", 1.3),
    "_BLOCK_M": ("more queries per program reuse each K/V tile more, fewer raise register pressure", 1.05),
    "_BLOCK_N": ("longer key tiles mean fewer loop trips and wider loads, shorter ones fewer registers", 1.05),
    "_NUM_WARPS": ("more warps per program hide memory latency and split the accumulator over more "
                   "registers", 1.05),
    "_NUM_STAGES": ("software pipelining: the next K/V tile loads while the current one is used", 1.05),
}


def read_tunables(text: str) -> dict[str, int]:
    return {m["name"]: int(m["value"]) for m in _LINE.finditer(text)}


def write_tunables(text: str, values: Mapping[str, int]) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m["name"]
        return f"{name} = {values[name]}{m['rest']}" if name in values else m.group(0)

    return _LINE.sub(repl, text)


def file_diff(path: str, old: str, new: str) -> str:
    lines = list(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                      fromfile=f"a/{path}", tofile=f"b/{path}"))
    return f"diff --git a/{path} b/{path}\n" + "".join(lines) if lines else ""


def _key(point: Mapping[str, object]) -> str:
    return "kernel-search:" + json.dumps(dict(sorted(point.items())), sort_keys=True)


def _why(name: str) -> tuple[str, float]:
    return next((v for suffix, v in _RATIONALE.items() if name.endswith(suffix)), ("a launch parameter", 1.02))


class KernelSearchProposer:
    name = "kernel-search"
    reads_profile = False

    def __init__(self, config: SearchConfig, *, kernel_file: str) -> None:
        self.config = config
        self.kernel_file = kernel_file        # relative to the workspace root, e.g. gemma4_attention/attention.py

    def _points(self, incumbent: dict[str, int], rng: random.Random) -> Iterator[dict[str, int]]:
        space = {k: [int(v) for v in vs] for k, vs in self.config.space.items()}
        if self.config.strategy == "random":
            moves = [(k, v) for k, values in space.items() for v in values if incumbent[k] != v]
            rng.shuffle(moves)
            for k, v in moves:
                yield {**incumbent, k: v}
        keys = sorted(space)
        rest = [dict(zip(keys, values, strict=True)) for values in itertools.product(*(space[k] for k in keys))]
        if self.config.strategy == "random":
            rng.shuffle(rest)
        yield from rest

    def propose(self, state: CampaignState, tools: Tools, *, rng: random.Random) -> Proposal | GiveUp:
        text = tools.read_file(self.kernel_file)
        current = read_tunables(text)
        missing = sorted(set(self.config.space) - set(current))
        if missing:
            return GiveUp(reason=f"tunables {missing} have no `NAME = int` line in {self.kernel_file}")
        incumbent = {k: current[k] for k in self.config.space}
        # The baseline's tunables (the campaign passes them as baseline_serving_config) were measured already.
        baseline = {k: v for k, v in state.baseline_serving_config.items() if k in incumbent}
        tried = {entry.source for entry in state.history} | {_key({**incumbent, **baseline})}
        local = random.Random(f"{self.config.seed}:{state.iteration}")   # a resumed campaign proposes the same
        for point in self._points(incumbent, local):
            changes = {k: v for k, v in point.items() if incumbent[k] != v}
            if not changes or _key(point) in tried:
                continue
            reasons = [f"{k}: {incumbent[k]} -> {v} ({_why(k)[0]})" for k, v in changes.items()]
            predicted = 1.0
            for k in changes:
                predicted *= _why(k)[1]
            return Proposal(hypothesis="Tunables change expected to lower kernel time on the shapes it governs: "
                                       + "; ".join(reasons),
                            patch=file_diff(self.kernel_file, text, write_tunables(text, point)),
                            predicted_speedup=round(predicted, 3), source=_key(point))
        return GiveUp(reason=f"search space exhausted ({len(tried)} points tried)")
