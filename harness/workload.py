"""Workload parity: the benchmark's own requests must yield the same tokens on both builds of an A/B.

Held-prompt parity sends its own requests (non-streaming, with logprobs); a candidate that recognised
them could be right there and wrong under the benchmark's traffic. Here nothing is sent for parity: the
two builds' runs of one (cell, repeat) received identical requests (same seed, temperature 0,
`ignore_eos`), and their generated texts are compared request by request, as token ids.

A divergence is judged by the reference's top-1/top-2 margin at that position, asked of the reference
build's server (thawed) with the prompt and the common prefix: at or above `tie_margin` it is a real
divergence and fails parity; below it, a tie flip that harmless numeric changes also cause. Only
prompts the harness wrote can be asked about (`benchmark.dataset: copy-task`); with the client's
random dataset the prompts are unknown, so divergences are counted and reported as unjudged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from harness.bench import CellRun

__all__ = ["Divergence", "WorkloadReport", "compare_workload", "DEFAULT_TIE_MARGIN", "MAX_LOOKUPS"]

DEFAULT_TIE_MARGIN = 1.0   # nats: the embedded checkpoint's copy positions have margins of 6-12
MAX_LOOKUPS = 16           # margin requests per comparison; divergences beyond are judged without one


@dataclass(frozen=True)
class Divergence:
    cell: str
    repeat: int
    request: int
    position: int                 # index of the first differing generated token
    reference_token: int | None
    candidate_token: int | None
    reference_margin: float | None = None   # None: not looked up (random dataset, or beyond MAX_LOOKUPS)

    def real(self, tie_margin: float) -> bool:
        return self.reference_margin is None or self.reference_margin >= tie_margin


@dataclass(frozen=True)
class WorkloadReport:
    requests: int
    identical: int
    divergences: tuple[Divergence, ...] = ()
    judged: bool = True                   # False: random dataset, margins unknown
    tie_margin: float = DEFAULT_TIE_MARGIN
    missing: tuple[str, ...] = field(default=())   # runs without generated texts (nothing to compare)

    @property
    def real_divergences(self) -> list[Divergence]:
        return [d for d in self.divergences if d.real(self.tie_margin)] if self.judged else []

    @property
    def ties(self) -> list[Divergence]:
        return [d for d in self.divergences if not d.real(self.tie_margin)] if self.judged else []

    @property
    def ok(self) -> bool:
        return not self.real_divergences and not (self.judged and self.missing)

    def summary(self) -> str:
        head = f"workload parity: {self.identical}/{self.requests} benchmark requests identical"
        if self.missing:
            head += f"; {len(self.missing)} runs saved no outputs ({', '.join(self.missing[:3])})"
        if not self.divergences:
            return head
        if not self.judged:
            return head + (f"; {len(self.divergences)} diverged, not judged (random dataset: the prompts, so the "
                           "margins, are unknown; benchmark.dataset: copy-task judges every request)")
        real, ties = self.real_divergences, self.ties
        text = head + f"; {len(ties)} tie flips (margin < {self.tie_margin:g} nats)"
        if real:
            d = max(real, key=lambda d: d.reference_margin or float("inf"))
            margin = f"{d.reference_margin:.2f} nats" if d.reference_margin is not None else "not looked up"
            text += (f"; {len(real)} REAL divergences, e.g. {d.cell} repeat {d.repeat} request {d.request} at "
                     f"token {d.position}: {d.reference_token} -> {d.candidate_token}, reference margin {margin}")
        return text

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "requests": self.requests, "identical": self.identical, "judged": self.judged,
                "tie_margin": self.tie_margin, "missing": list(self.missing),
                "divergences": [asdict(d) for d in self.divergences[:64]],
                "divergence_count": len(self.divergences)}


def _encoder(tokenizer_dir: Path) -> Callable[[str, bool], list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return lambda text, special: tok.encode(text, add_special_tokens=special).ids


def _margin(base_url: str, model: str, prompt_ids: list[int], timeout_s: float) -> float | None:
    payload = {"model": model, "prompt": prompt_ids, "max_tokens": 1, "temperature": 0.0, "logprobs": 2,
               "return_tokens_as_token_ids": True}
    try:
        response = httpx.post(f"{base_url}/v1/completions", json=payload, timeout=timeout_s)
        top = response.json()["choices"][0]["logprobs"]["top_logprobs"][0]
        values = sorted((float(v) for v in top.values()), reverse=True)
        return values[0] - values[1] if len(values) >= 2 else None
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError):
        return None


def compare_workload(reference_runs: Sequence[CellRun], candidate_runs: Sequence[CellRun], *, tokenizer: Path,
                     reference_url: str | None = None, model: str = "", tie_margin: float = DEFAULT_TIE_MARGIN,
                     timeout_s: float = 60.0, before_lookup: Callable[[], None] = lambda: None) -> WorkloadReport:
    """Pair runs by (cell, repeat), compare their requests' outputs as token ids; ask `reference_url` for
    the margin at (up to MAX_LOOKUPS) divergences. `before_lookup` runs once before the first request
    (the caller thaws the reference server)."""
    encode = _encoder(tokenizer)
    by_key = {(r.job.cell.label, r.job.repeat): r for r in candidate_runs}
    requests = identical = 0
    divergences: list[Divergence] = []
    lookups: list[tuple[int, list[int]]] = []
    missing: list[str] = []
    judged = all(r.prompts for r in reference_runs)
    for ref in reference_runs:
        cand = by_key.get((ref.job.cell.label, ref.job.repeat))
        label = f"{ref.job.cell.label}#r{ref.job.repeat}"
        if cand is None or not ref.texts or len(ref.texts) != len(cand.texts):
            missing.append(label)
            continue
        for index, (a, b) in enumerate(zip(ref.texts, cand.texts, strict=True)):
            requests += 1
            if a == b:
                identical += 1
                continue
            ids_a, ids_b = encode(a, False), encode(b, False)
            pos = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y),
                       min(len(ids_a), len(ids_b)))
            at = lambda ids, i: ids[i] if i < len(ids) else None  # noqa: E731
            divergences.append(Divergence(ref.job.cell.label, ref.job.repeat, index, pos, at(ids_a, pos),
                                          at(ids_b, pos)))
            if judged and reference_url and len(lookups) < MAX_LOOKUPS:
                lookups.append((len(divergences) - 1, encode(ref.prompts[index], True) + ids_a[:pos]))
    if lookups:
        before_lookup()
        for at_index, prompt_ids in lookups:
            d = divergences[at_index]
            divergences[at_index] = Divergence(**{**asdict(d), "reference_margin": _margin(
                reference_url or "", model, prompt_ids, timeout_s)})
    return WorkloadReport(requests=requests, identical=identical, divergences=tuple(divergences), judged=judged,
                          tie_margin=tie_margin, missing=tuple(missing))
