"""What the E2B-shaped checkpoint must show before its weights are written (train.py), and what it reports.

The margin check is on the positions parity generates: each held prompt of the GPU specs
(experiments/prompts/gemma4-e2b-shaped-parity.jsonl) followed by its 64 expected tokens, teacher-forced, so the
logits at the 64 generated positions are what greedy generation sees while every earlier answer is right. It
passes when every answer is right and the top-1/top-2 margin is at least 1 nat at 99.9 % of the positions (a
flipped near-tie would otherwise be reported as a parity failure of a harmless candidate).

Also reported (not enforced): accuracy and margins by length on fresh task sequences, and the sensitivity of the
logprobs to a 10 % change of each part a patch may touch.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["MARGIN_NATS", "MIN_CONFIDENT", "HELD_PROMPTS", "load_held", "held_margins", "margins", "sensitivity"]

MARGIN_NATS = 1.0
MIN_CONFIDENT = 0.999
HELD_PROMPTS = Path(__file__).resolve().parents[2] / "prompts" / "gemma4-e2b-shaped-parity.jsonl"


def load_held(path: Path = HELD_PROMPTS) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, expected generated ids) of each held prompt."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r["prompt_token_ids"], r["expected_token_ids"]) for r in rows]


def _batches(rows: list[tuple[list[int], list[int]]], tokens: int) -> Iterator[list[tuple[list[int], list[int]]]]:
    """Rows sorted by length, grouped so that a padded batch holds at most `tokens` tokens."""
    rows = sorted(rows, key=lambda r: len(r[0]) + len(r[1]))
    batch: list[tuple[list[int], list[int]]] = []
    for row in rows:
        if batch and (len(batch) + 1) * (len(row[0]) + len(row[1])) > tokens:
            yield batch
            batch = []
        batch.append(row)
    if batch:
        yield batch


@torch.no_grad()
def held_margins(model: torch.nn.Module, rows: list[tuple[list[int], list[int]]], *, device: str,
                 tokens: int = 32768) -> dict[str, Any]:
    """The check: right answers and margins at every generated position of the held prompts (teacher-forced)."""
    gaps, right = [], 0
    for batch in _batches(rows, tokens):
        width = max(len(p) + len(e) for p, e in batch) - 1
        x = torch.zeros(len(batch), width, dtype=torch.long)
        for i, (prompt, expected) in enumerate(batch):       # right-padded: a causal model never looks ahead
            seq = prompt + expected
            x[i, : len(seq) - 1] = torch.tensor(seq[:-1])
        logits = model(input_ids=x.to(device)).logits.float()
        for i, (prompt, expected) in enumerate(batch):
            at = logits[i, len(prompt) - 1: len(prompt) - 1 + len(expected)].log_softmax(-1)
            top2 = at.topk(2, -1)
            right += int((top2.indices[:, 0].cpu() == torch.tensor(expected)).sum())
            gaps.append((top2.values[:, 0] - top2.values[:, 1]).cpu())
    gap = torch.cat(gaps)
    confident = float((gap >= MARGIN_NATS).float().mean())
    out = {"prompts": len(rows), "positions": int(gap.numel()), "wrong": int(gap.numel()) - right,
           "frac_margin_ge_1": round(confident, 5), "margin_min": round(float(gap.min()), 3),
           "margin_p1": round(float(gap.quantile(0.01)), 3), "margin_median": round(float(gap.median()), 3)}
    out["passed"] = out["wrong"] == 0 and confident >= MIN_CONFIDENT
    return out


@torch.no_grad()
def logprobs(model: torch.nn.Module, x: torch.Tensor, chunk: int) -> torch.Tensor:
    return torch.cat([torch.log_softmax(model(input_ids=x[i:i + chunk]).logits[:, :-1].float(), -1)
                      for i in range(0, len(x), chunk)])


def margins(logp: torch.Tensor, x: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    """Accuracy and top-1/top-2 margins of the copy positions, overall and per mode (even rows short)."""
    top2 = logp.topk(2, -1)
    m = mask[:, 1:]
    correct = (top2.indices[..., 0] == x[:, 1:]) & m
    gap = (top2.values[..., 0] - top2.values[..., 1])[m]
    out: dict[str, Any] = {
        "positions": int(m.sum()), "acc": round(correct.sum().item() / m.sum().item(), 5),
        "gap_min": round(gap.min().item(), 3), "gap_p1": round(gap.quantile(0.01).item(), 3),
        "gap_median": round(gap.median().item(), 3), "frac_gap_ge_1": round((gap >= 1.0).float().mean().item(), 5)}
    for name, rows in (("short", slice(0, None, 2)), ("mixed", slice(1, None, 2))):
        out[f"acc_{name}"] = round(correct[rows].sum().item() / max(1, m[rows].sum().item()), 5)
    return out


def parts(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """One scale per part a patch may touch (the tensor a 10 % change multiplies)."""
    layers, types = model.model.layers, list(model.config.layer_types)
    first_full = types.index("full_attention")
    last_sliding = len(types) - 2  # KV-shared, sliding
    shared_full = len(types) - 1  # KV-shared, full
    return {
        "sliding attention (layer 0 o_proj)": layers[0].self_attn.o_proj.weight,
        f"full attention (layer {first_full} o_proj)": layers[first_full].self_attn.o_proj.weight,
        f"KV-shared sliding layer ({last_sliding} o_proj)": layers[last_sliding].self_attn.o_proj.weight,
        f"KV-shared full layer ({shared_full} o_proj)": layers[shared_full].self_attn.o_proj.weight,
        "PLE token table": model.model.embed_tokens_per_layer.weight,
        "PLE projection": model.model.per_layer_model_projection.weight,
        f"q norm (layer {first_full})": layers[first_full].self_attn.q_norm.weight,
        "post-feed-forward norm (layer 1)": layers[1].post_feedforward_layernorm.weight,
        "MLP (layer 1 down_proj)": layers[1].mlp.down_proj.weight,
        f"double-wide MLP (layer {shared_full} down_proj)": layers[shared_full].mlp.down_proj.weight,
    }


@contextlib.contextmanager
def scaled(t: torch.Tensor, factor: float) -> Iterator[None]:
    saved = t.detach().clone()
    t.data.mul_(factor)
    try:
        yield
    finally:
        t.data.copy_(saved)


@torch.no_grad()
def sensitivity(model: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor, chunk: int) -> list[dict[str, Any]]:
    base = logprobs(model, x, chunk)
    m = mask[:, 1:]
    rows = []
    for name, t in parts(model).items():
        # Gemma's RMS norms scale by (1 + weight) in some versions and by weight in others: perturb the
        # effective scale either way by scaling the stored weight, which is what a patch would change.
        with scaled(t, 1.1):
            lp = logprobs(model, x, chunk)
        drift = (lp - base).abs().amax(-1)[m]
        flips = (lp.argmax(-1) != base.argmax(-1))[m]
        rows.append({"part": name, "max_logprob_drift": round(drift.max().item(), 4),
                     "mean_logprob_drift": round(drift.mean().item(), 5), "greedy_flips": int(flips.sum())})
    return rows
