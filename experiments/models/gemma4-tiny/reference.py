"""transformers reference for the tiny Gemma 4: exact greedy decoding and planted-bug variants.

Greedy decoding is computed by teacher forcing to a fixed point rather than step by step: feed
prompt + a guessed continuation, take the argmax at every position, replace the guess from the first
disagreement on, repeat. When the argmax agrees with the guess everywhere, the guess *is* the greedy
continuation (by induction over positions), and one batched forward per round covers all prompts
(right padding is invisible to causal attention). For a correct model the task's expected
continuation is already the fixed point, so a round or two suffices.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from task import PAD_ID

__all__ = ["BUGS", "changed_prompts", "greedy", "load_buggy", "load_model"]

NEW_TOKENS = 64


def load_model(path: Path, *, config_edit: Callable[[Any], None] | None = None) -> torch.nn.Module:
    """Load the checkpoint in float32 with the plain (eager) attention path, optionally editing the
    config first: sliding window and rope live in the config, so editing it rebuilds those parts."""
    from transformers import AutoConfig, Gemma4ForCausalLM

    config = AutoConfig.from_pretrained(str(path))
    if config_edit is not None:
        config_edit(config)
    model = Gemma4ForCausalLM.from_pretrained(str(path), config=config, dtype=torch.float32,
                                              attn_implementation="eager")
    return model.eval()


@torch.no_grad()
def _forced(model: torch.nn.Module, prompts: list[list[int]], conts: list[list[int]]) -> torch.Tensor:
    """Log-probs at the positions that predict each continuation token: [n, NEW_TOKENS, vocab]."""
    seqs = [p + c for p, c in zip(prompts, conts, strict=True)]
    width = max(map(len, seqs))
    x = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        x[i, : len(s)] = torch.tensor(s)
    logp = torch.log_softmax(model(input_ids=x).logits.float(), -1)
    rows = [logp[i, len(p) - 1 : len(p) - 1 + NEW_TOKENS] for i, p in enumerate(prompts)]
    return torch.stack(rows)


def greedy(model: torch.nn.Module, prompts: list[dict[str, Any]], *, max_rounds: int = NEW_TOKENS + 1,
           batch: int = 64) -> dict[str, dict[str, Any]]:
    """Exact greedy continuations (64 tokens) with top-2 (id, logprob) per position, keyed by prompt id."""
    out: dict[str, dict[str, Any]] = {}
    for b in range(0, len(prompts), batch):
        chunk = prompts[b : b + batch]
        ptoks = [list(p["prompt_token_ids"]) for p in chunk]
        guess = [list(p.get("expected_token_ids") or [PAD_ID] * NEW_TOKENS)[:NEW_TOKENS] for p in chunk]
        for _ in range(max_rounds):
            logp = _forced(model, ptoks, guess)
            best = logp.argmax(-1).tolist()
            changed = False
            for i, (g, a) in enumerate(zip(guess, best, strict=True)):
                k = next((j for j in range(NEW_TOKENS) if g[j] != a[j]), None)
                if k is not None:
                    guess[i] = g[:k] + a[k:]
                    changed = True
            if not changed:
                break
        else:
            raise RuntimeError("greedy fixed point not reached; raise max_rounds")
        top = logp.topk(2, -1)
        for i, p in enumerate(chunk):
            out[p["id"]] = {"token_ids": guess[i],
                            "top2": [[(int(t), float(v)) for t, v in zip(ti, vi, strict=True)]
                                     for ti, vi in zip(top.indices[i].tolist(), top.values[i].tolist(),
                                                       strict=True)]}
    return out


@torch.no_grad()
def changed_prompts(model: torch.nn.Module, prompts: list[dict[str, Any]],
                    ref: dict[str, dict[str, Any]]) -> list[str]:
    """Ids of the prompts whose greedy continuation under ``model`` differs from ``ref``.

    One forced forward suffices: the greedy output equals ref's iff the argmax after prompt + ref's
    first k tokens is ref's token k for every k (again by induction over positions).
    """
    ptoks = [list(p["prompt_token_ids"]) for p in prompts]
    conts = [list(ref[p["id"]]["token_ids"]) for p in prompts]
    best = _forced(model, ptoks, conts).argmax(-1).tolist()
    return [p["id"] for p, b, c in zip(prompts, best, conts, strict=True) if b != c]


# --- planted bugs, transformers side (mirrors of planted/*.patch for vLLM) -------------------------

def _halve_window(c: Any) -> None:
    c.sliding_window = c.sliding_window // 2


def _full_rope_theta(c: Any) -> None:
    c.rope_parameters = copy.deepcopy(c.rope_parameters)
    c.rope_parameters["full_attention"]["rope_theta"] = 10_000.0


def _ple_scale(model: torch.nn.Module) -> None:
    # PLE token embeddings scaled by hidden_size (128) instead of sqrt(hidden_size_per_layer_input) (4).
    # Milder rescalings (x0 .. x4) flip little: see README, "Planted bugs".
    emb = model.model.embed_tokens_per_layer
    emb.embed_scale.fill_(float(model.config.hidden_size))


def _skip_norm(model: torch.nn.Module) -> None:
    # The post-feed-forward norm dropped in every decoder layer (as the vLLM patch drops its one call).
    for layer in model.model.layers:
        layer.post_feedforward_layernorm = torch.nn.Identity()


# name -> (config edit before load, module edit after load); names match planted/<name>.patch
BUGS: dict[str, tuple[Callable[[Any], None] | None, Callable[[torch.nn.Module], None] | None]] = {
    "sliding-window-halved": (_halve_window, None),
    "ple-scale-changed": (None, _ple_scale),
    "norm-skipped": (None, _skip_norm),
    "full-rope-theta-changed": (_full_rope_theta, None),
}


def load_buggy(path: Path, bug: str) -> torch.nn.Module:
    config_edit, module_edit = BUGS[bug]
    model = load_model(path, config_edit=config_edit)
    if module_edit is not None:
        with torch.no_grad():
            module_edit(model)
    return model
